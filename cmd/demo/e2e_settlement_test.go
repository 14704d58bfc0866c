package main

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
)

// The demo's default admin token.
const adminTokenDefault = "demo-admin-token"

type (
	settlement struct {
		Slot        string `json:"slot"`
		Amount      int64  `json:"amount"`
		OperationID string `json:"operationId"`
	}
	firedSettlement struct {
		Client      string  `json:"client"`
		OperationID string  `json:"operationId"`
		Created     bool    `json:"created"`
		Status      string  `json:"status"`
		Amount      *int64  `json:"amount"`
		Error       *string `json:"error"`
	}
	firedSlot struct {
		Slot        string            `json:"slot"`
		Settlements []firedSettlement `json:"settlements"`
	}
)

// settle fires slot's settlements through the admin endpoint, and requires 200.
func (d *demo) settle(t *testing.T, slot string) firedSlot {
	t.Helper()
	r := d.client(t, adminTokenDefault).post("/admin/settlements", "", map[string]string{"slot": slot})
	requireStatus(t, r, http.StatusOK)
	return decodeAs[firedSlot](t, r)
}

func (c *apiClient) settlements() []settlement {
	c.t.Helper()
	r := c.get("/settlements")
	requireStatus(c.t, r, http.StatusOK)
	body := decodeAs[struct {
		Settlements []settlement `json:"settlements"`
	}](c.t, r)
	require.NotNil(c.t, body.Settlements, "settlements must be [], not null")
	return body.Settlements
}

// of returns the client's settlement in a firing.
func (f firedSlot) of(t *testing.T, client string) firedSettlement {
	t.Helper()
	for _, s := range f.Settlements {
		if s.Client == client {
			return s
		}
	}
	t.Fatalf("no settlement of %s in %+v", client, f)
	return firedSettlement{}
}

// TestSettlements: a client's merchant balance moves to the payout account of
// a slot once per (client, slot), whoever fires the slot, however often and at
// once, and whatever crashes.
func TestSettlements(t *testing.T) {
	t.Parallel()

	t.Run("ByHand", func(t *testing.T) {
		t.Parallel()
		dbURL := testdb.URL(t)
		d := startDemo(t, dbURL, nil)
		a, b := d.client(t, tokenA), d.client(t, tokenB)
		a.createOrder("A-1", "cus_1", 5000)
		b.createOrder("B-1", "cus_2", 700)
		requireStatus(t, a.post("/refunds", newKey(), map[string]any{"orderId": "A-1", "amount": 1000}), http.StatusCreated)
		require.Empty(t, a.settlements())

		const s1 = "2026-12-01T10:00:00Z"
		first := d.settle(t, s1)
		require.Equal(t, s1, first.Slot)
		require.Len(t, first.Settlements, 2, "every client")
		fa := first.of(t, "merchant-a")
		require.True(t, fa.Created)
		require.Equal(t, "succeeded", fa.Status)
		require.Equal(t, int64(4000), *fa.Amount)
		require.Equal(t, int64(700), *first.of(t, "merchant-b").Amount)

		again := d.settle(t, "2026-12-01T11:00:00+01:00") // the same instant
		require.Equal(t, s1, again.Slot)
		ga := again.of(t, "merchant-a")
		require.False(t, ga.Created, "fired before")
		require.Equal(t, fa.OperationID, ga.OperationID)
		require.Equal(t, int64(4000), *ga.Amount)

		accounts := a.requireBooksSettled(5000, 1000, 4000)
		require.Equal(t, int64(4000), balance(accounts, "payout:"+s1))
		require.Equal(t, []settlement{{Slot: s1, Amount: 4000, OperationID: fa.OperationID}}, a.settlements())
		op := a.getOperation(fa.OperationID)
		require.Equal(t, "settlement", op.Name)
		require.Equal(t, "schedule settlement "+s1, op.Key)

		// Another slot later settles what came since, and an earlier slot
		// fired late settles then: nothing, since nothing is left.
		a.createOrder("A-2", "cus_1", 300)
		const s2, s0 = "2026-12-01T12:00:00Z", "2026-12-01T09:00:00Z"
		require.Equal(t, int64(300), *d.settle(t, s2).of(t, "merchant-a").Amount)
		require.Equal(t, int64(0), *d.settle(t, s0).of(t, "merchant-a").Amount)
		got := a.settlements()
		require.Equal(t, []string{s0, s1, s2}, []string{got[0].Slot, got[1].Slot, got[2].Slot}, "oldest first")
		a.requireBooksSettled(5300, 1000, 4300)
		require.Len(t, b.settlements(), 3)
		b.requireBooksSettled(700, 0, 700)
	})

	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		d := startDemo(t, testdb.URL(t), nil)
		body := map[string]string{"slot": "2026-12-01T10:00:00Z"}
		for _, token := range []string{"", tokenA, "nope"} {
			requireError(t, d.client(t, token).post("/admin/settlements", "", body), http.StatusUnauthorized, "unauthenticated")
		}
		admin := d.client(t, adminTokenDefault)
		for _, bad := range []string{`{}`, `{"slot": 5}`, `{"slot": "yesterday"}`, `{"slot": "2026-12-01T10:00:00.5Z"}`, `{"slot": "2026-12-01"}`} {
			e := requireError(t, admin.post("/admin/settlements", "", bad), http.StatusBadRequest, "invalid_request")
			require.Equal(t, "slot", e.Param, bad)
		}
		requireError(t, admin.post("/admin/settlements", "", `{"slot": "2026-12-01T10:00:00Z", "x": 1}`), http.StatusBadRequest, "invalid_request")
		requireError(t, d.client(t, "").get("/settlements"), http.StatusUnauthorized, "unauthenticated")
		requireError(t, admin.get("/admin/settlements"), http.StatusMethodNotAllowed, "method_not_allowed")
	})

	// Two processes fire the same slot at once, three times each, for five
	// slots: each (client, slot) settles once, and the payouts are the
	// balances.
	t.Run("TwoProcessesAtOnce", func(t *testing.T) {
		t.Parallel()
		dbURL := testdb.URL(t)
		demos := []*demo{startDemo(t, dbURL, nil), startDemo(t, dbURL, nil)}
		a, b := demos[0].client(t, tokenA), demos[1].client(t, tokenB)
		var orders int64
		for round := 1; round <= 5; round++ {
			amount := int64(round * 100)
			a.createOrder(fmt.Sprintf("A-%d", round), "cus_1", amount)
			b.createOrder(fmt.Sprintf("B-%d", round), "cus_2", amount)
			orders += amount
			slot := time.Date(2026, 12, 1, round, 0, 0, 0, time.UTC).Format(time.RFC3339)
			var wg sync.WaitGroup
			answers := make([]firedSlot, 6)
			for i := range answers {
				wg.Go(func() { answers[i] = demos[i%2].settle(t, slot) })
			}
			wg.Wait()
			for _, client := range []string{"merchant-a", "merchant-b"} {
				created := 0
				for _, ans := range answers {
					s := ans.of(t, client)
					if s.Created {
						created++
					}
					require.Equal(t, answers[0].of(t, client).OperationID, s.OperationID, "one operation per (client, slot)")
				}
				require.Equal(t, 1, created, "round %d, %s: one firing started it", round, client)
			}
			for _, c := range []*apiClient{a, b} {
				accounts := c.requireBooksSettled(orders, 0, orders)
				require.Equal(t, amount, balance(accounts, "payout:"+slot), "round %d", round)
			}
		}
		require.Len(t, a.settlements(), 5)
		require.Len(t, b.settlements(), 5)
		require.EqualValues(t, 10, dbCount(t, dbURL, "SELECT count(*) FROM idemflow_operation WHERE name = 'settlement' AND state = 'succeeded'"))
		require.EqualValues(t, 10, dbCount(t, dbURL, "SELECT count(DISTINCT move_id) FROM demo_ledger_entry WHERE kind = 'settlement'"))
	})

	// Every process fires every slot of -settlement-interval: two processes,
	// one slot a second, each (client, slot) once.
	t.Run("Every", func(t *testing.T) {
		t.Parallel()
		dbURL := testdb.URL(t)
		opts := &demoOpts{args: []string{"-settlement-interval", "1s"}}
		d1, d2 := startDemo(t, dbURL, opts), startDemo(t, dbURL, opts)
		a := d1.client(t, tokenA)
		for i := range 5 {
			a.createOrder(fmt.Sprintf("A-%d", i), "cus_1", 100)
			time.Sleep(300 * time.Millisecond) // orders spread over slots
		}
		eventually(t, func() bool { return balance(a.accounts(), "merchant") == 0 }, "everything settled")
		slot := len(a.settlements())
		eventually(t, func() bool { return len(a.settlements()) >= slot+2 }, "two more slots")
		var sum int64
		for _, s := range a.settlements() {
			sum += s.Amount
		}
		require.Equal(t, int64(500), sum)
		require.Zero(t, dbCount(t, dbURL, "SELECT count(*) FROM idemflow_operation WHERE name = 'settlement' AND state <> 'succeeded' AND finished_at IS NOT NULL"),
			"no firing ran a slot twice")
		require.Zero(t, dbCount(t, dbURL, `SELECT count(*) FROM (SELECT 1 FROM demo_ledger_entry WHERE kind = 'settlement' AND amount > 0
			GROUP BY client, account HAVING count(*) > 1) AS twice`), "one move per payout account")
		d2.client(t, tokenB).requireBooksSettled(0, 0, 0)
	})

	// The demo dies in the settle step, after its statement and before its
	// commit: nothing committed, the slot's key included; firing the slot
	// again settles it, once.
	t.Run("Crash", func(t *testing.T) {
		t.Parallel()
		dbURL := testdb.URL(t)
		d := startDemo(t, dbURL, &demoOpts{crash: "settle:after-effect"})
		d.client(t, tokenA).createOrder("A-1", "cus_1", 900)
		_, err := d.client(t, adminTokenDefault).send(http.MethodPost, "/admin/settlements", "", map[string]string{"slot": "2026-12-01T10:00:00Z"})
		require.Error(t, err, "the crash cuts the connection")
		require.Equal(t, crashExitCode, d.waitExit())
		require.Zero(t, dbCount(t, dbURL, "SELECT count(*) FROM demo_settlement"))

		d = startDemo(t, dbURL, nil)
		fired := d.settle(t, "2026-12-01T10:00:00Z").of(t, "merchant-a")
		require.True(t, fired.Created)
		require.Equal(t, int64(900), *fired.Amount)
		d.settle(t, "2026-12-01T10:00:00Z")
		d.client(t, tokenA).requireBooksSettled(900, 0, 900)
		require.EqualValues(t, 1, dbCount(t, dbURL, "SELECT count(DISTINCT move_id) FROM demo_ledger_entry WHERE kind = 'settlement' AND client = 'merchant-a'"))
	})
}

// requireBooksSettled checks the client's ledger with settlements: balances
// summing to zero, the merchant's equal to its orders less its refunds less
// what was paid out, the payout accounts' sum to what was paid out.
func (c *apiClient) requireBooksSettled(orders, refunds, paidOut int64) []account {
	c.t.Helper()
	accounts := c.accounts()
	var sum, payouts int64
	for _, a := range accounts {
		sum += a.Balance
		if len(a.Account) > len("payout:") && a.Account[:len("payout:")] == "payout:" {
			payouts += a.Balance
		}
	}
	require.Zero(c.t, sum, "balances sum to zero: %+v", accounts)
	require.Equal(c.t, paidOut, payouts, "paid out: %+v", accounts)
	require.Equal(c.t, orders-refunds-paidOut, balance(accounts, "merchant"), "merchant = orders - refunds - paid out: %+v", accounts)
	return accounts
}
