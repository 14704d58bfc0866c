package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/internal/doccheck"
)

// TestQuickstart runs the README's service against a real PostgreSQL and a
// bank that counts its payouts by idempotency key.
func TestQuickstart(t *testing.T) {
	t.Parallel()
	dbURL := idemflowtest.DatabaseURL(t)
	var mu sync.Mutex
	made := map[string]int{}
	bank := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		key := r.Header.Get("Idempotency-Key")
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/payouts":
			made[key]++
			_, _ = io.WriteString(w, `{"id":"po_`+key[len(key)-6:]+`"}`)
		case strings.HasPrefix(r.URL.Path, "/payouts/by-key/"):
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"code":"not_found","message":"no payout"}`)
		}
	}))
	t.Cleanup(bank.Close)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	ctx, cancel := context.WithCancel(context.Background())
	reg := prometheus.NewRegistry()
	done := make(chan error, 1)
	go func() { done <- run(ctx, dbURL, bank.URL, addr, "admin-secret", reg, reg) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	base := "http://" + addr
	require.Eventually(t, func() bool {
		res, err := http.Get(base + "/metrics")
		if err == nil {
			_ = res.Body.Close()
		}
		return err == nil && res.StatusCode == http.StatusOK
	}, 30*time.Second, 50*time.Millisecond)
	conn, err := pgx.Connect(t.Context(), dbURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(t.Context(), `INSERT INTO wallet VALUES ('w-1', 100)`)
	require.NoError(t, err)

	do := func(method, path, key, body string) (*http.Response, string) {
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("X-Client", "shop-1")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res, string(b)
	}
	res, body := do(http.MethodPost, "/payouts", "p-1", `{"wallet":"w-1","amount":30}`)
	require.Equal(t, http.StatusCreated, res.StatusCode, body)
	again, body2 := do(http.MethodPost, "/payouts", "p-1", `{"wallet":"w-1","amount":30}`)
	require.Equal(t, http.StatusCreated, again.StatusCode)
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	require.Equal(t, body, body2)
	res2, body := do(http.MethodPost, "/payouts", "p-2", `{"wallet":"w-1","amount":100}`)
	require.Equal(t, http.StatusUnprocessableEntity, res2.StatusCode, body)
	require.Contains(t, body, "insufficient_funds")
	res3, body := do(http.MethodPost, "/payouts", "p-3", `{"wallet":"w-1","amount":-1}`)
	require.Equal(t, http.StatusBadRequest, res3.StatusCode, body)

	var balance int64
	require.NoError(t, conn.QueryRow(t.Context(), `SELECT balance FROM wallet WHERE id = 'w-1'`).Scan(&balance))
	require.Equal(t, int64(70), balance)
	mu.Lock()
	require.Len(t, made, 1, "one payout at the bank")
	for _, n := range made {
		require.Equal(t, 1, n, "asked once")
	}
	mu.Unlock()

	_, body = do(http.MethodGet, "/operations/"+res.Header.Get("Operation-Id"), "", "")
	var op struct {
		Status string
		Steps  []struct{ Name, Status string }
	}
	require.NoError(t, json.Unmarshal([]byte(body), &op), body)
	require.Equal(t, "succeeded", op.Status)
	require.Len(t, op.Steps, 2)

	req, err := http.NewRequest(http.MethodGet, base+"/ops", nil)
	require.NoError(t, err)
	req.SetBasicAuth("ann", "admin-secret")
	page, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = page.Body.Close()
	require.Equal(t, http.StatusOK, page.StatusCode)
	// The operators' JSON API, where the pages' handler serves it by
	// default (under /ops/api): a mount that served nothing would fail here.
	req, err = http.NewRequest(http.MethodGet, base+"/ops/api/operations/"+res.Header.Get("Operation-Id"), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer admin-secret")
	api, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	apiBody, err := io.ReadAll(api.Body)
	require.NoError(t, err)
	_ = api.Body.Close()
	require.Equal(t, http.StatusOK, api.StatusCode, string(apiBody))
	require.Contains(t, string(apiBody), `"status":"succeeded"`)
	_, body = do(http.MethodGet, "/metrics", "", "")
	require.Contains(t, body, `idemflow_operations_started_total{operation="payout"} 2`)

	// Every path that README.md and the guide say the quick start serves
	// (internal/doccheck's Paths) is routed here, with its method.
	for _, p := range doccheck.ServedBy(doccheck.Quickstart) {
		method, path := doccheck.Request(p, res.Header.Get("Operation-Id"))
		var body io.Reader
		if method != http.MethodGet {
			body = strings.NewReader(`{}`)
		}
		req, err := http.NewRequest(method, base+path, body)
		require.NoError(t, err)
		req.Header.Set("X-Client", "shop-1")
		req.Header.Set("Idempotency-Key", "doc-paths")
		req.SetBasicAuth("ann", "admin-secret")
		got, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		b, err := io.ReadAll(got.Body)
		require.NoError(t, err)
		_ = got.Body.Close()
		require.False(t, doccheck.NotServed(got.StatusCode, b), "%s, documented: %d %s", p, got.StatusCode, b)
	}
}

// TestReadmeQuickstart: the README's quick start is this command's main.go,
// as it is: what CI builds and tests is what a reader copies.
func TestReadmeQuickstart(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("main.go")
	require.NoError(t, err)
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	require.Contains(t, string(readme), "```go\n"+string(src)+"```\n", "README.md's quick start differs from cmd/quickstart/main.go")
}
