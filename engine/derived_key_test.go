package engine

import (
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

func TestDerivedKey(t *testing.T) {
	t.Parallel()
	id := uuid.MustParse("0193a6f0-0000-7000-8000-000000000001")
	secret := []byte("0123456789abcdef")

	t.Run("Scheme3", func(t *testing.T) {
		t.Parallel()
		secret3 := append([]byte{keyScheme3}, secret...)
		k := derivedKey(id, secret3, "refund", "merchant-a", "8e03978e", "provider")
		require.Regexp(t, `^idf3_[A-Za-z0-9_-]{48}$`, k)
		require.Equal(t, k, derivedKey(id, secret3, "x", "y", "z", "provider"), "the id and secret stand for the rest")
		for _, other := range []string{
			derivedKey(uuid.MustParse("0193a6f0-0000-7000-8000-000000000002"), secret3, "refund", "merchant-a", "8e03978e", "provider"),
			derivedKey(id, append([]byte{keyScheme3}, "0123456789abcdeg"...), "refund", "merchant-a", "8e03978e", "provider"),
			derivedKey(id, secret3, "refund", "merchant-a", "8e03978e", "ledger"),
		} {
			require.NotEqual(t, k, other)
		}
		// The key carries its operation's id, for reconciliation.
		got, ok := operationOfKey(k)
		require.True(t, ok)
		require.Equal(t, id, got)
		for _, bad := range []string{"", "idf3_", "idf2_" + k[5:], k + "A", k[:len(k)-1], "idf3_" + strings.Repeat("*", 48)} {
			_, ok := operationOfKey(bad)
			require.False(t, ok, bad)
		}
		require.True(t, olderKeyScheme(derivedKey(id, secret, "refund", "merchant-a", "8e03978e", "provider")))
		require.False(t, olderKeyScheme(k))
		// Pinned: a changed scheme would make retries ask providers for new refunds.
		require.Equal(t, "idf3_AZOm8AAAcACAAAAAAAAAAUeC2oE2e_hc83ZmmjaE_iripsvX", k)
	})

	t.Run("Scheme2", func(t *testing.T) {
		t.Parallel()
		k := derivedKey(id, secret, "refund", "merchant-a", "8e03978e", "provider")
		require.Regexp(t, `^idf2_[A-Za-z0-9_-]{43}$`, k)
		require.Equal(t, k, derivedKey(id, secret, "refund", "merchant-a", "8e03978e", "provider"), "deterministic")
		// The client's key, scope and operation name do not enter: the operation's
		// id and secret stand for them, and a new operation under an old key gets
		// new ones.
		require.Equal(t, k, derivedKey(id, secret, "x", "y", "z", "provider"))
		for _, other := range []string{
			derivedKey(uuid.MustParse("0193a6f0-0000-7000-8000-000000000002"), secret, "refund", "merchant-a", "8e03978e", "provider"),
			derivedKey(id, []byte("0123456789abcdeg"), "refund", "merchant-a", "8e03978e", "provider"),
			derivedKey(id, secret, "refund", "merchant-a", "8e03978e", "ledger"),
		} {
			require.NotEqual(t, k, other)
		}
		// Pinned: a changed scheme would make retries ask providers for new refunds.
		require.Equal(t, "idf2_ZZGPyTIDrLHK-dgrZMoLAXWEtJnl-hWdC4rGrempfW4", k)
	})

	t.Run("Scheme1ForOperationsWithoutSecret", func(t *testing.T) {
		t.Parallel()
		k := derivedKey(id, nil, "refund", "merchant-a", "8e03978e", "provider")
		require.Regexp(t, `^idf1_[A-Za-z0-9_-]{43}$`, k)
		for _, other := range []string{
			derivedKey(id, nil, "refunds", "merchant-a", "8e03978e", "provider"),
			derivedKey(id, nil, "refund", "merchant-b", "8e03978e", "provider"),
			derivedKey(id, nil, "refund", "merchant-a", "8e03978f", "provider"),
			derivedKey(id, nil, "refund", "merchant-a", "8e03978e", "ledger"),
			derivedKey(id, nil, "refund", "merchant-a8e03978e", "", "provider"),
		} {
			require.NotEqual(t, k, other)
		}
		// Pinned: operations reserved before scheme 2 keep these keys.
		require.Equal(t, "idf1_1ct08ZTf4a47mqfGWnA7UZHi5sZELuadC4rZKleEiLo", k)
		require.Equal(t, k, derivedKey(uuid.Nil, nil, "refund", "merchant-a", "8e03978e", "provider"), "scheme 1 ignores the id")
	})

	t.Run("SecretsDiffer", func(t *testing.T) {
		t.Parallel()
		require.Len(t, newKeySecret(), keySecretSize)
		require.Equal(t, byte(keyScheme3), newKeySecret()[0])
		require.NotEqual(t, newKeySecret(), newKeySecret())
	})
}
