package main

import (
	"context"
	"net/http"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
)

func TestExploreFinalize(t *testing.T) {
	dbURL := testdb.URL(t)
	d := startDemo(t, dbURL, &demoOpts{args: []string{"-max-attempts", "2", "-retry-backoff", "20ms", "-wait", "300ms"}, env: []string{"DEMO_FAIL=finalize:1000"}})
	c := d.client(t, tokenA)
	c.createOrder("A-1", "cus_1", 5000)
	r := c.post("/refunds", newKey(), map[string]any{"orderId": "A-1", "amount": 700})
	t.Logf("%d %s %v", r.status, r.body, r.header)
	id := r.header.Get("Operation-Id")
	time.Sleep(2 * time.Second)
	op := c.get("/operations/" + id)
	t.Logf("%s", op.body)
	bin, _ := demoBinary()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "ops", "cancel", id)
	cmd.Env = append(demoEnviron(), "DATABASE_URL="+dbURL)
	out, err := cmd.CombinedOutput()
	t.Logf("live: %v %s", err, out)
	d.kill()
	time.Sleep(1500 * time.Millisecond)
	cmd = exec.CommandContext(ctx, bin, "ops", "cancel", id)
	cmd.Env = append(demoEnviron(), "DATABASE_URL="+dbURL)
	out, err = cmd.CombinedOutput()
	t.Logf("dead: %v %s", err, out)
	_ = http.StatusOK
	require.True(t, false)
}
