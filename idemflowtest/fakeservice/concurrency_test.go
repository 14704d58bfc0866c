package fakeservice_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest/fakeservice"
)

// concurrent sends n requests at once, the i-th made by build(i), and returns
// their answers, or fails the test on a client error.
func concurrent(t *testing.T, base string, n int, build func(i int) request) []answer {
	t.Helper()
	answers := make([]answer, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			answers[i], errs[i] = send(t, nil, base, build(i))
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "request %d", i)
	}
	return answers
}

func TestConcurrent(t *testing.T) {
	t.Parallel()
	const n = 64

	t.Run("one key: exactly one effect, every answer the same", func(t *testing.T) {
		t.Parallel()
		svc := fakeservice.Start(t, nil)
		answers := concurrent(t, svc.URL(), n, func(int) request {
			return request{key: "k1", body: `{"amount":100}`}
		})
		replayed := 0
		for i, a := range answers {
			require.Equal(t, http.StatusCreated, a.status, "request %d", i)
			require.Equal(t, string(answers[0].body), string(a.body), "request %d", i)
			if a.header.Get("Idempotent-Replayed") == "true" {
				replayed++
			}
		}
		require.Equal(t, n-1, replayed)
		require.Equal(t, 1, svc.Effects())
		require.Equal(t, 1, svc.EffectsFor("k1"))
		require.Equal(t, n, svc.Requests())

		calls := svc.Calls("k1")
		require.Len(t, calls, n)
		effects := 0
		for i, c := range calls {
			require.Equal(t, i+1, c.Attempt)
			if c.Effect {
				effects++
			}
		}
		require.Equal(t, 1, effects)
		require.True(t, calls[0].Effect, "the first handled takes effect")
		require.Nil(t, svc.Duplicates())
	})

	t.Run("one key, different bodies: exactly one effect, the others refused or replayed", func(t *testing.T) {
		t.Parallel()
		svc := fakeservice.Start(t, nil)
		answers := concurrent(t, svc.URL(), n, func(i int) request {
			return request{key: "k1", body: fmt.Sprintf(`{"amount":%d}`, i%4)}
		})
		require.Equal(t, 1, svc.Effects())
		var winner struct {
			Request struct{ Amount int }
		}
		for _, a := range answers {
			if a.status == http.StatusCreated && a.header.Get("Idempotent-Replayed") == "" {
				require.NoError(t, json.Unmarshal(a.body, &winner))
			}
		}
		for i, a := range answers {
			if i%4 == winner.Request.Amount {
				require.Equal(t, http.StatusCreated, a.status, "request %d: %s", i, a.body)
			} else {
				require.Equal(t, http.StatusUnprocessableEntity, a.status, "request %d: %s", i, a.body)
				require.Equal(t, "idempotency_key_reused", a.code(t))
			}
		}
	})

	t.Run("one key under faults: exactly one effect", func(t *testing.T) {
		t.Parallel()
		svc := fakeservice.Start(t, &fakeservice.Options{
			FaultFunc: func(req fakeservice.Request, attempt int) fakeservice.Fault {
				return []fakeservice.Fault{fakeservice.FaultError, fakeservice.FaultNone}[attempt%2]
			},
		})
		answers := concurrent(t, svc.URL(), n, func(int) request {
			return request{key: "k1", body: `{"amount":100}`}
		})
		statuses := map[int]int{}
		for _, a := range answers {
			statuses[a.status]++
		}
		require.Equal(t, map[int]int{http.StatusCreated: n / 2, http.StatusServiceUnavailable: n / 2}, statuses)
		require.Equal(t, 1, svc.Effects())
	})

	t.Run("many keys, one body: one effect each, all duplicates", func(t *testing.T) {
		t.Parallel()
		svc := fakeservice.Start(t, nil)
		answers := concurrent(t, svc.URL(), n, func(i int) request {
			return request{key: fmt.Sprintf("k%02d", i), body: `{"amount":100}`}
		})
		ids := map[string]bool{}
		for _, a := range answers {
			require.Equal(t, http.StatusCreated, a.status)
			var m made
			require.NoError(t, json.Unmarshal(a.body, &m))
			ids[m.ID] = true
		}
		require.Len(t, ids, n, "every effect has its own id")
		require.Equal(t, n, svc.Effects())
		require.Len(t, svc.Keys(), n)
		dups := svc.Duplicates()
		require.Len(t, dups, 1)
		require.Len(t, dups[0].Keys, n)
		require.Equal(t, n, dups[0].Requests)
	})

	t.Run("inspection while requests run", func(t *testing.T) {
		t.Parallel()
		svc := fakeservice.Start(t, nil)
		done := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				_ = svc.Effects()
				_ = svc.Requests()
				_ = svc.Duplicates()
				for _, k := range svc.Keys() {
					_ = svc.Calls(k)
					_ = svc.EffectsFor(k)
				}
				svc.FailNext(1, fakeservice.FaultNone)
			}
		})
		concurrent(t, svc.URL(), n, func(i int) request {
			if i%2 == 0 {
				return request{method: http.MethodGet, path: fmt.Sprintf("/by-key/k%d", i%8)}
			}
			return request{key: fmt.Sprintf("k%d", i%8), body: `{}`}
		})
		close(done)
		wg.Wait()
		require.Equal(t, 4, svc.Effects())
		require.Equal(t, n/2, svc.Lookups())
	})
}
