package main

// The contract's "Operators" from the outside: /ops, /riverui/ and /admin/*
// behind the admin token, as HTTP Basic (any user name) or a bearer token, and
// never a client's token; the JSON list; retry and cancel over /admin.

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
)

const adminToken = "demo-admin-token"

// basicAuth is an Authorization header of HTTP Basic authentication.
func basicAuth(user, password string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password))
}

// operatorRequest sends a request with the given Authorization header (none
// when empty) and more header pairs, and reads the answer.
func (d *demo) operatorRequest(t *testing.T, method, path, authorization, body string, header ...string) *response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, d.base+path, strings.NewReader(body))
	require.NoError(t, err)
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	client := &http.Client{Timeout: httpClient.Timeout, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	require.NoError(t, err, "%s %s", method, path)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return &response{status: resp.StatusCode, header: resp.Header, body: data}
}

// admin sends a request with the admin token as a bearer token.
func (d *demo) admin(t *testing.T, method, path, body string) *response {
	t.Helper()
	return d.operatorRequest(t, method, path, "Bearer "+adminToken, body)
}

// adminOperation is an operation of GET /admin/operations/{id}.
type adminOperation struct {
	OperationID string `json:"operationId"`
	Client      string `json:"client"`
	Status      string `json:"status"`
	Parked      bool   `json:"parked"`
	Failure     *struct {
		Code  string `json:"code"`
		Cause string `json:"cause"`
	} `json:"failure"`
	Steps []struct {
		Name       string  `json:"name"`
		Status     string  `json:"status"`
		Attempts   int     `json:"attempts"`
		DerivedKey string  `json:"derivedKey"`
		ResolvedBy string  `json:"resolvedBy"`
		SettleBy   *string `json:"settleBy"`
		LastError  *string `json:"lastError"`
		LastCause  *string `json:"lastCause"`
	} `json:"steps"`
}

func TestOperators(t *testing.T) {
	t.Parallel()
	d := startDemo(t, testdb.URL(t), &demoOpts{args: []string{"-max-attempts", "3", "-provider-timeout", "500ms", "-provider-settle", "500ms"}})
	require.Contains(t, d.stdout.String(), adminToken, "the admin token is printed at start")
	a, b := d.client(t, tokenA), d.client(t, tokenB)

	// a's refund succeeds; b's fails: the provider answers 503 to its three
	// attempts, and asked by key it has no refund.
	a.createOrder("A-1", "cus_1", 5000)
	requireStatus(t, a.post("/refunds", newKey(), map[string]any{"orderId": "A-1", "amount": 700}), http.StatusCreated)
	b.createOrder("B-1", "cus_2", 3000)
	b.setFault("error", 3, 0)
	key := newKey()
	body := map[string]any{"orderId": "B-1", "amount": 1000}
	r := b.postUntilFinal("/refunds", key, body)
	requireError(t, r, http.StatusInternalServerError, "operation_failed")
	failedID := r.header.Get("Operation-Id")

	t.Run("Unauthenticated", func(t *testing.T) {
		for _, auth := range []string{"", "Bearer " + tokenA, basicAuth("merchant-a", tokenA), "Bearer " + adminToken + "x", basicAuth(adminToken, ""), "Basic " + adminToken} {
			for _, path := range []string{"/ops", "/ops/operations/" + failedID, "/riverui/", "/riverui/api/queues", "/admin/operations", "/admin/operations/" + failedID} {
				r := d.operatorRequest(t, http.MethodGet, path, auth, "")
				requireError(t, r, http.StatusUnauthorized, "unauthenticated")
				if !strings.HasPrefix(path, "/admin") {
					require.True(t, strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Basic"), "%s: WWW-Authenticate %q", path, r.header.Get("WWW-Authenticate"))
				}
			}
			r := d.operatorRequest(t, http.MethodPost, "/admin/operations/"+failedID+"/retry", auth, "")
			requireError(t, r, http.StatusUnauthorized, "unauthenticated")
		}
		// The admin token is no client's.
		requireError(t, d.client(t, adminToken).get("/accounts"), http.StatusUnauthorized, "unauthenticated")
	})

	t.Run("Pages", func(t *testing.T) {
		for _, auth := range []string{basicAuth("anyone", adminToken), basicAuth("", adminToken), "Bearer " + adminToken} {
			r := d.operatorRequest(t, http.MethodGet, "/ops", auth, "", "Accept", "text/html")
			require.Equal(t, http.StatusOK, r.status, "body %s", r.body)
			require.Equal(t, "text/html; charset=utf-8", r.header.Get("Content-Type"))
			require.Contains(t, string(r.body), failedID, "operations of every client")
			require.NotContains(t, strings.ToLower(string(r.body)), "<script")
		}
		r := d.operatorRequest(t, http.MethodGet, "/ops/operations/"+failedID, basicAuth("ops", adminToken), "", "Accept", "text/html")
		require.Equal(t, http.StatusOK, r.status, "body %s", r.body)
		op := b.getOperation(failedID)
		require.Len(t, op.Steps, 3)
		for _, st := range op.Steps {
			require.Contains(t, string(r.body), `id="step-`+st.Name+`"`)
		}
		require.Contains(t, string(r.body), stepOf(t, op, "provider").DerivedKey)
		require.Contains(t, string(r.body), `action="/ops/operations/`+failedID+`/retry"`)
	})

	t.Run("RiverUI", func(t *testing.T) {
		r := d.operatorRequest(t, http.MethodGet, "/riverui/", basicAuth("ops", adminToken), "")
		require.Equal(t, http.StatusOK, r.status, "body %s", r.body)
		require.Contains(t, r.header.Get("Content-Type"), "text/html")
		r = d.operatorRequest(t, http.MethodGet, "/riverui/api/queues", "Bearer "+adminToken, "")
		require.Equal(t, http.StatusOK, r.status, "body %s", r.body)
		var queues struct {
			Data []struct {
				Name string `json:"name"`
			} `json:"data"`
		}
		require.NoError(t, json.Unmarshal(r.body, &queues), "body %s", r.body)
		require.NotNil(t, queues.Data, "body %s", r.body)
		// A cross-site form cannot reach River UI's API that changes jobs.
		r = d.operatorRequest(t, http.MethodPost, "/riverui/api/jobs/cancel", basicAuth("ops", adminToken), `{"job_ids":["1"]}`,
			"Sec-Fetch-Site", "cross-site")
		requireError(t, r, http.StatusForbidden, "cross_origin_request")
	})

	t.Run("List", func(t *testing.T) {
		r := d.admin(t, http.MethodGet, "/admin/operations", "")
		requireStatus(t, r, http.StatusOK)
		type listed struct {
			operation
			Client string `json:"client"`
		}
		list := decodeAs[struct {
			Operations []listed `json:"operations"`
		}](t, r)
		clients := map[string]int{}
		newest := ""
		for _, op := range list.Operations {
			require.Nil(t, op.Steps, "no steps in the list")
			if newest == "" {
				newest = op.OperationID
			}
			clients[op.Client]++
		}
		raw := decodeAs[struct {
			Operations []json.RawMessage `json:"operations"`
		}](t, r)
		for _, op := range raw.Operations {
			requireKeys(t, op, "operationId", "client", "name", "version", "key", "status", "needsAttention", "createdAt", "finishedAt")
		}
		require.Equal(t, map[string]int{"merchant-a": 2, "merchant-b": 2}, clients, "orders and refunds of both clients")
		require.Equal(t, failedID, newest, "newest first")

		r = d.admin(t, http.MethodGet, "/admin/operations?status=failed&name=refund&limit=10", "")
		failed := decodeAs[struct {
			Operations []listed `json:"operations"`
		}](t, r)
		require.Len(t, failed.Operations, 1)
		require.Equal(t, "merchant-b", failed.Operations[0].Client)
		require.Equal(t, key, failed.Operations[0].Key)

		r = d.admin(t, http.MethodGet, "/admin/operations?name=refund&limit=1", "")
		requireStatus(t, r, http.StatusOK)
		require.Contains(t, r.header.Get("Link"), `rel="next"`)
		requireError(t, d.admin(t, http.MethodGet, "/admin/operations?status=broken", ""), http.StatusBadRequest, "invalid_request")
	})

	t.Run("RetryAndCancel", func(t *testing.T) {
		r := d.admin(t, http.MethodGet, "/admin/operations/"+failedID, "")
		requireStatus(t, r, http.StatusOK)
		var op adminOperation
		require.NoError(t, json.Unmarshal(r.body, &op))
		require.Equal(t, "merchant-b", op.Client)
		require.EqualValues(t, "attempts_exhausted", op.Failure.Code)
		require.Len(t, op.Steps, 3)
		prov := op.Steps[1]
		require.Equal(t, "provider", prov.Name)
		require.Equal(t, 3, prov.Attempts)
		require.NotNil(t, prov.LastCause, "the operators' cause")
		require.Equal(t, stepOf(t, b.getOperation(failedID), "provider").DerivedKey, prov.DerivedKey)

		requireError(t, d.admin(t, http.MethodPost, "/admin/operations/"+failedID+"/cancel", ""), http.StatusConflict, "operation_finished")
		// The client was told 500: only a forced retry reopens it.
		requireError(t, d.admin(t, http.MethodPost, "/admin/operations/"+failedID+"/retry", ""), http.StatusConflict, "operation_final")
		told := b.post("/refunds", key, body)
		requireError(t, told, http.StatusInternalServerError, "operation_failed")
		r = d.admin(t, http.MethodPost, "/admin/operations/"+failedID+"/retry", `{"force": true}`)
		requireStatus(t, r, http.StatusOK)
		// The key replays the 500 until the reopened operation finishes, then
		// answers the new run's answer.
		var final *response
		require.Eventually(t, func() bool {
			final = b.post("/refunds", key, body)
			if final.status == http.StatusInternalServerError {
				require.Equal(t, string(told.body), string(final.body))
				require.Equal(t, "true", final.header.Get("Idempotent-Replayed"))
			}
			return final.status != http.StatusInternalServerError
		}, 60*time.Second, 50*time.Millisecond)
		r = final
		requireStatus(t, r, http.StatusCreated)
		require.Equal(t, "succeeded", decodeAs[refundBody](t, r).Status)
		refunds := b.providerRefunds()
		n := 0
		for _, pr := range refunds {
			if pr.IdempotencyKey == prov.DerivedKey {
				n++
			}
		}
		require.Equal(t, 1, n, "one provider refund under the derived key: %+v", refunds)
		requireError(t, d.admin(t, http.MethodPost, "/admin/operations/"+failedID+"/retry", ""), http.StatusConflict, "operation_not_failed")
		requireError(t, d.admin(t, http.MethodPost, "/admin/operations/"+uuid.NewString()+"/retry", ""), http.StatusNotFound, "operation_not_found")
	})
}

// TestOperatorsPastPivot: finalize keeps failing after the provider refunded;
// the operation needs attention, and a cancel over /admin or from the page is
// refused, past its point of no return.
func TestOperatorsPastPivot(t *testing.T) {
	t.Parallel()
	d := startDemo(t, testdb.URL(t), &demoOpts{
		args: []string{"-max-attempts", "2", "-retry-backoff", "10ms", "-wait", "300ms"},
		env:  []string{"DEMO_FAIL=finalize:1000000"},
	})
	c := d.client(t, tokenA)
	c.createOrder("A-1", "cus_1", 5000)
	id := requireAccepted(t, c.post("/refunds", newKey(), map[string]any{"orderId": "A-1", "amount": 700}))
	c.awaitOperation(id, pollInterval, "needing attention", needsAttention)

	r := d.admin(t, http.MethodGet, "/admin/operations?needsAttention=true", "")
	requireStatus(t, r, http.StatusOK)
	require.Contains(t, string(r.body), id)

	r = d.admin(t, http.MethodPost, "/admin/operations/"+id+"/cancel", `{"reason":"customer withdrew"}`)
	requireError(t, r, http.StatusConflict, "past_point_of_no_return")
	r = d.operatorRequest(t, http.MethodPost, "/ops/operations/"+id+"/cancel", basicAuth("ops", adminToken), "reason=x",
		"Content-Type", "application/x-www-form-urlencoded", "Accept", "text/html", "Sec-Fetch-Site", "same-origin")
	require.Equal(t, http.StatusConflict, r.status, "body %s", r.body)
	require.Contains(t, string(r.body), "past_point_of_no_return")
	require.Equal(t, "in_progress", c.getOperation(id).Status, "nothing was cancelled")
}
