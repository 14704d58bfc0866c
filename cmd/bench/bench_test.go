package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		sql  string
		cat  category
		name string
	}{
		{sql: "begin", cat: catTxControl, name: "BEGIN"},
		{sql: "begin isolation level serializable", cat: catTxControl, name: "BEGIN"},
		{sql: " COMMIT ", cat: catTxControl, name: "COMMIT"},
		{sql: "rollback", cat: catTxControl, name: "ROLLBACK"},
		{sql: "-- name: OperationInsert :one\nINSERT INTO idemflow_operation (id) VALUES ($1)", cat: catEngine, name: "OperationInsert"},
		{sql: "-- name: StepCheckpointMany :one\nWITH cp AS (INSERT INTO idemflow_step ...)", cat: catEngine, name: "StepCheckpointMany"},
		{sql: "-- name: OperationReserve :execrows\nINSERT INTO bench_operation (id) VALUES ($1)", cat: catEngine, name: "OperationReserve"},
		{sql: "-- name: RefundRecordReserved :execrows\nWITH taken AS (UPDATE demo_order ... FROM bench_operation ...)", cat: catSteps, name: "RefundRecordReserved"},
		{sql: "-- name: RefundRecord :one\nWITH taken AS (UPDATE demo_order ...) SELECT customer_id FROM taken", cat: catSteps, name: "RefundRecord"},
		{sql: "-- name: JobGetAvailable :many\nSELECT * FROM /* TEMPLATE: schema */river_job", cat: catRiver, name: "JobGetAvailable"},
		{sql: "-- name: RefundUpsert :one\nINSERT INTO provider.refund (id) VALUES ($1)", cat: catProvider, name: "RefundUpsert"},
		{sql: "select 1", cat: catOther, name: "SELECT"},
	} {
		cat, name := classify(tc.sql)
		require.Equal(t, tc.cat, cat, tc.sql)
		require.Equal(t, tc.name, name, tc.sql)
	}
}

// TestRun runs every mode briefly against the test cluster: the program works
// and counts what it should. It asserts counts, never speed.
func TestRun(t *testing.T) {
	t.Parallel()
	results := map[string]result{}
	for _, line := range runJSON(t, "-n", "20", "-c", "4", "-warmup", "4", "-history", "50") {
		var r result
		require.NoError(t, json.Unmarshal(line, &r), string(line))
		results[r.Mode] = r
	}
	require.Len(t, results, len(allModes))
	for mode, r := range results {
		require.Zero(t, r.Errors, mode)
		require.Equal(t, 20, r.N, mode)
		require.Equal(t, 4, r.Concurrency, mode)
		require.Equal(t, 50, r.History, mode)
		require.Positive(t, r.OpsPerS, mode)
		require.GreaterOrEqual(t, r.CommitsPerOp, r.EngineCommitsPerOp, mode)
	}

	// The baseline sends two batches, each its own transaction; the provider
	// commits its two statements.
	bl := results[modeBaseline]
	require.InDelta(t, 2.0, bl.RoundTripsPerOp, 1e-9)
	require.InDelta(t, 2.0, bl.EngineCommitsPerOp, 1e-9)
	require.InDelta(t, 2.0, bl.ProviderCommitsPerOp, 1e-9)
	// The server counts more: the pool's pings of connections idle for a second
	// (an empty query is a transaction too), and whatever else ran in the
	// database meanwhile (seen: 7.65 per refund over 20 refunds under load), so
	// only the lower bound holds.
	require.GreaterOrEqual(t, bl.CommitsPerOp, 3.9, "the server's count of commits covers the tracers'")

	// The refund is recorded in one statement, by the baseline as by the
	// workflow's ledger step; finalize marks it succeeded.
	require.InDelta(t, 1.0, bl.Statements["RefundRecordReserved"], 1e-9)
	require.InDelta(t, 2.0, bl.StepStatementsPerOp, 1e-9)
	eng := results[modeEngine]
	require.InDelta(t, 1.0, eng.Statements["RefundRecord"], 1e-9)
	require.InDelta(t, 2.0, eng.StepStatementsPerOp, 1e-9)
	// The engine's two transactions; a sweep of the engine's may add one commit
	// to the run (0.05 over 20 refunds). Transactions that shared a commit
	// (a group) shared its round trip too: each group of k spared k-1 of
	// both.
	shared := eng.CommitGroupsPerOp * (eng.CommitGroupSize - 1)
	require.GreaterOrEqual(t, eng.EngineCommitsPerOp+shared, 2.0-1e-6, "%v", eng.Statements)
	require.Less(t, eng.EngineCommitsPerOp+shared, 2.5, "%v", eng.Statements)
	require.Zero(t, eng.EngineRollbacksPerOp)
	// One round trip per transaction, as in the baseline: each step's statement
	// (AtCommit) goes with BEGIN, the checkpoint and COMMIT, and the ledger's
	// with the reservation too (a sweep may add one to the run).
	require.GreaterOrEqual(t, eng.RoundTripsPerOp+shared, 2.0-1e-6, "%v", eng.Statements)
	require.Less(t, eng.RoundTripsPerOp+shared, 2.5, "%v", eng.Statements)
	require.Zero(t, eng.CommitGroupsSplit, "no member of a group failed")

	// Every refund reserves its key once, with no read first, over HTTP too;
	// a replay's reservation finds the key taken, and then it reads the
	// operation once.
	require.InDelta(t, 1.0, results[modeEngine].Statements["OperationReserve"], 1e-9)
	require.InDelta(t, 1.0, results[modeHTTP].Statements["OperationReserve"], 1e-9)
	require.Zero(t, results[modeHTTP].Statements["OperationGetByKey"])
	require.Equal(t, map[string]float64{"OperationReserve": 1, "OperationGetByKey": 1}, results[modeReplay].Statements)
}

// runJSON runs the benchmark with args and -json against the test cluster,
// requires that it succeeds, and returns the lines it printed.
func runJSON(t *testing.T, args ...string) [][]byte {
	t.Helper()
	adminURL := testdb.AdminURL(t)
	getenv := func(key string) string {
		if key == "DATABASE_URL" {
			return adminURL
		}
		return ""
	}
	var stdout, stderr bytes.Buffer
	code := run(append(args, "-json"), getenv, &stdout, &stderr)
	require.Equal(t, 0, code, "stderr: %s", stderr.String())
	var lines [][]byte
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		lines = append(lines, bytes.Clone(sc.Bytes()))
	}
	require.NoError(t, sc.Err())
	return lines
}
