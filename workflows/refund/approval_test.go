package refund_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/workflows/refund"
)

// setupV3 is setup with version 3 of the refund: refunds of at least 1000
// wait for approvals, by need distinct actors, for at most timeout.
func setupV3(t *testing.T, need int, timeout time.Duration) *bundle {
	t.Helper()
	return setupWith(t, setupOpts{config: &refund.Config{
		RefundVersions:    []int{refund.RefundV1, refund.RefundV3},
		ApprovalThreshold: 1000,
		Approvals:         need,
		ApprovalTimeout:   timeout,
	}})
}

// startRefund starts a refund and returns without waiting for it.
func (b *bundle) startRefund(t *testing.T, key, orderID string, amount int64) *engine.Started {
	t.Helper()
	s, err := engine.Start(t.Context(), b.e, b.wf.Refund, "merchant-a", key,
		refund.RefundInput{Client: "merchant-a", OrderID: orderID, Amount: amount}, nil)
	require.NoError(t, err)
	require.True(t, s.Created)
	return s
}

// awaitApproval waits until the refund id waits at its approval step, and
// returns that step.
func (b *bundle) awaitApproval(t *testing.T, id uuid.UUID) engine.StepInfo {
	t.Helper()
	var st engine.StepInfo
	require.Eventually(t, func() bool {
		info, err := b.e.Get(t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, engine.StatusInProgress, info.Status)
		for _, s := range info.Steps {
			if s.Name == refund.StepApproval {
				st = s
			}
		}
		return st.Status == engine.StepStatusWaiting
	}, 30*time.Second, 10*time.Millisecond, "the refund waits for approval")
	return st
}

// decide approves (or rejects) the operation id as actor.
func (b *bundle) decide(t *testing.T, approve bool, id uuid.UUID, actor, reason string) (*engine.Info, error) {
	t.Helper()
	ctx := engine.WithActor(t.Context(), actor)
	if approve {
		return b.e.Approve(ctx, id, reason)
	}
	return b.e.Reject(ctx, id, reason)
}

func TestRefundApproval(t *testing.T) {
	t.Parallel()

	t.Run("BelowThresholdPassesAtOnce", func(t *testing.T) {
		t.Parallel()
		b := setupV3(t, 1, time.Hour)
		b.mustOrder(t, "merchant-a", "A-1", "cus_1", 5000)
		info := b.refund(t, "merchant-a", "key-1", "A-1", 999)
		require.Equal(t, engine.StatusSucceeded, info.Status, "error: %v", info.Error)
		require.Equal(t, refund.RefundV3, info.Version)
		out, err := b.wf.Refund.Result(info)
		require.NoError(t, err)
		require.NotNil(t, out.Receipt, "version 3 gives a receipt")

		got, err := b.e.Get(t.Context(), info.ID)
		require.NoError(t, err)
		var names []string
		for _, s := range got.Steps {
			names = append(names, s.Name)
			require.Equal(t, engine.StepStatusSucceeded, s.Status, "step %s", s.Name)
		}
		require.Equal(t, []string{refund.StepLedger, refund.StepApproval, refund.StepProvider, refund.StepFinalize, refund.StepReceipt}, names)
		require.Empty(t, got.Audit)
		require.Len(t, b.providerRefunds(t), 1)
	})

	t.Run("AboveThresholdWaitsForDistinctApprovals", func(t *testing.T) {
		t.Parallel()
		b := setupV3(t, 2, time.Hour)
		b.mustOrder(t, "merchant-a", "A-1", "cus_1", 5000)
		s := b.startRefund(t, "key-1", "A-1", 1000)
		st := b.awaitApproval(t, s.ID)
		require.NotNil(t, st.Wait)
		require.Equal(t, engine.WaitApproval, st.Wait.Reason)
		require.Equal(t, 2, st.Wait.Need)
		waiting, err := b.e.Get(t.Context(), s.ID)
		require.NoError(t, err)
		require.False(t, waiting.NeedsAttention(), "it waits for people, not for a repair")

		// The amount is reserved; the provider is not asked yet.
		require.Equal(t, map[string]int64{"customer:cus_1": -4000, "merchant": 4000}, b.balances(t, "merchant-a"))
		require.Empty(t, b.providerRefunds(t))
		list, err := refund.ListApprovals(t.Context(), b.pool, b.e, 0)
		require.NoError(t, err)
		require.Len(t, list, 1)
		a := list[0]
		require.Equal(t, s.ID, a.OperationID)
		require.Equal(t, "merchant-a", a.Client)
		require.Equal(t, "A-1", a.OrderID)
		require.Equal(t, int64(1000), a.Amount)
		require.Equal(t, 2, a.Need)
		require.NotNil(t, a.ExpiresAt)
		require.Equal(t, time.Hour, a.ExpiresAt.Sub(a.RequestedAt), "fixed when it was reached")
		require.Equal(t, []string{}, a.ApprovedBy)

		// The same actor twice counts once.
		for range 2 {
			info, err := b.decide(t, true, s.ID, "ann", "checked the order")
			require.NoError(t, err)
			require.Equal(t, engine.StatusInProgress, info.Status)
		}
		list, err = refund.ListApprovals(t.Context(), b.pool, b.e, 0)
		require.NoError(t, err)
		require.Len(t, list, 1)
		require.Equal(t, []string{"ann"}, list[0].ApprovedBy)
		require.Empty(t, b.providerRefunds(t))

		_, err = b.decide(t, true, s.ID, "bob", "fine by me")
		require.NoError(t, err)
		info := wait(t, s)
		require.Equal(t, engine.StatusSucceeded, info.Status, "error: %v", info.Error)
		require.Len(t, b.providerRefunds(t), 1)
		require.Equal(t, map[string]int64{"customer:cus_1": -4000, "merchant": 4000}, b.balances(t, "merchant-a"))
		require.Equal(t, refund.StatusSucceeded, b.getOrder(t, "merchant-a", "A-1").Refunds[0].Status)
		list, err = refund.ListApprovals(t.Context(), b.pool, b.e, 0)
		require.NoError(t, err)
		require.Empty(t, list)

		_, err = b.decide(t, true, s.ID, "carol", "late")
		require.ErrorIs(t, err, engine.ErrFinished)
		got, err := b.e.Get(t.Context(), s.ID)
		require.NoError(t, err)
		var results []string
		for _, e := range got.Audit {
			require.Equal(t, engine.ActionApprove, e.Action)
			results = append(results, e.Actor+":"+e.Result)
		}
		require.Equal(t, []string{"ann:done", "ann:done", "bob:done", "carol:refused"}, results)
	})

	t.Run("ZeroThresholdEveryRefundWaits", func(t *testing.T) {
		t.Parallel()
		b := setupWith(t, setupOpts{config: &refund.Config{RefundVersions: []int{refund.RefundV3}}})
		b.mustOrder(t, "merchant-a", "A-1", "cus_1", 5000)
		s := b.startRefund(t, "key-1", "A-1", 1)
		st := b.awaitApproval(t, s.ID)
		require.Equal(t, refund.DefaultApprovals, st.Wait.Need)
		require.NotNil(t, st.Wait.Until)
		_, err := b.decide(t, true, s.ID, "ann", "ok")
		require.NoError(t, err)
		require.Equal(t, engine.StatusSucceeded, wait(t, s).Status)
	})

	t.Run("RejectionReversesTheLedger", func(t *testing.T) {
		t.Parallel()
		b := setupV3(t, 1, time.Hour)
		b.mustOrder(t, "merchant-a", "A-1", "cus_1", 5000)
		s := b.startRefund(t, "key-1", "A-1", 3000)
		b.awaitApproval(t, s.ID)
		_, err := b.decide(t, false, s.ID, "carol", "")
		require.ErrorIs(t, err, engine.ErrReasonRequired)
		_, err = b.decide(t, false, s.ID, "carol", "the customer was paid by check")
		require.NoError(t, err)

		info := wait(t, s)
		requireFailed(t, info, refund.CodeRefundRejected, refund.StepApproval)
		require.Equal(t, map[string]int64{"customer:cus_1": -5000, "merchant": 5000}, b.balances(t, "merchant-a"))
		require.Zero(t, b.orderRefunded(t, "merchant-a", "A-1"))
		o := b.getOrder(t, "merchant-a", "A-1")
		require.Len(t, o.Refunds, 1)
		require.Equal(t, refund.StatusFailed, o.Refunds[0].Status)
		require.Empty(t, b.providerRefunds(t), "the provider was never asked")
		steps := b.stepsOf(t, info)
		require.Equal(t, engine.StepStatusCompensated, steps[refund.StepLedger].Status)
		require.Equal(t, engine.StepStatusFailed, steps[refund.StepApproval].Status)
		require.Equal(t, engine.StepStatusSkipped, steps[refund.StepProvider].Status)

		_, err = b.decide(t, true, s.ID, "ann", "too late")
		require.ErrorIs(t, err, engine.ErrFinished)
		// The amount is refundable again.
		require.Equal(t, engine.StatusSucceeded, b.refund(t, "merchant-a", "key-2", "A-1", 999).Status)
	})

	t.Run("ExpiresWithoutApproval", func(t *testing.T) {
		t.Parallel()
		b := setupV3(t, 1, 300*time.Millisecond)
		b.mustOrder(t, "merchant-a", "A-1", "cus_1", 5000)
		s := b.startRefund(t, "key-1", "A-1", 5000)
		info := wait(t, s)
		requireFailed(t, info, refund.CodeApprovalExpired, refund.StepApproval)
		require.Equal(t, map[string]int64{"customer:cus_1": -5000, "merchant": 5000}, b.balances(t, "merchant-a"))
		require.Zero(t, b.orderRefunded(t, "merchant-a", "A-1"))
		require.Equal(t, refund.StatusFailed, b.getOrder(t, "merchant-a", "A-1").Refunds[0].Status)
		require.Empty(t, b.providerRefunds(t))

		_, err := b.decide(t, true, s.ID, "ann", "too late")
		require.ErrorIs(t, err, engine.ErrFinished)
	})

	t.Run("NotAwaitingApproval", func(t *testing.T) {
		t.Parallel()
		b := setupV3(t, 1, time.Hour)
		b.mustOrder(t, "merchant-a", "A-1", "cus_1", 5000)
		// A refund that waits for the provider's word, not for approval.
		b.fault(t, `{"mode": "pending", "count": 1, "delayMs": 60000}`)
		s := b.startRefund(t, "key-1", "A-1", 10)
		require.Eventually(t, func() bool {
			info, err := b.e.Get(t.Context(), s.ID)
			require.NoError(t, err)
			return info.Steps[2].Status == engine.StepStatusWaiting
		}, 30*time.Second, 10*time.Millisecond)
		_, err := b.decide(t, true, s.ID, "ann", "why not")
		require.ErrorIs(t, err, engine.ErrNotAwaitingApproval)
		_, err = b.decide(t, true, uuid.New(), "ann", "why not")
		require.ErrorIs(t, err, engine.ErrNotFound)
	})
}

func TestNewApprovalConfig(t *testing.T) {
	t.Parallel()
	provider := &refund.ProviderClient{BaseURL: "http://127.0.0.1:1"}
	for _, tc := range []struct {
		name string
		cfg  refund.Config
		ok   bool
	}{
		{"Defaults", refund.Config{RefundVersions: []int{refund.RefundV3}}, true},
		{"ZeroThresholdEveryRefundWaits", refund.Config{RefundVersions: []int{refund.RefundV3}, ApprovalThreshold: 0, Approvals: 2, ApprovalTimeout: time.Minute}, true},
		{"NegativeThreshold", refund.Config{RefundVersions: []int{refund.RefundV3}, ApprovalThreshold: -1}, false},
		{"NegativeApprovals", refund.Config{RefundVersions: []int{refund.RefundV3}, Approvals: -1}, false},
		{"NegativeTimeout", refund.Config{RefundVersions: []int{refund.RefundV3}, ApprovalTimeout: -time.Second}, false},
		{"NoVersion4", refund.Config{RefundVersions: []int{4}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			wf, err := refund.New(provider, &tc.cfg)
			if !tc.ok {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, refund.RefundV3, wf.Refund.Version())
		})
	}
}
