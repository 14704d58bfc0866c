package opsweb_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/opsweb"
)

func TestNew(t *testing.T) {
	t.Parallel()
	e := idemflowtest.Engine(t, idemflowtest.Pool(t, nil), nil)
	auth := opsweb.TokenAuth("x")
	for _, tt := range []struct {
		name    string
		e       *engine.Engine
		cfg     *opsweb.Config
		wantErr string
	}{
		{"NoEngine", nil, &opsweb.Config{AuthFunc: auth}, "an engine is required"},
		{"NoConfig", e, nil, "AuthFunc is required"},
		{"NoAuthFunc", e, &opsweb.Config{}, "AuthFunc is required"},
		{"RelativeBase", e, &opsweb.Config{AuthFunc: auth, BasePath: "ops"}, "BasePath"},
		{"RootBase", e, &opsweb.Config{AuthFunc: auth, BasePath: "/"}, "BasePath"},
		{"TrailingSlash", e, &opsweb.Config{AuthFunc: auth, BasePath: "/ops/"}, "BasePath"},
		{"Pattern", e, &opsweb.Config{AuthFunc: auth, APIPath: "/api/{x}"}, "APIPath"},
		{"SamePaths", e, &opsweb.Config{AuthFunc: auth, BasePath: "/x", APIPath: "/x"}, "both"},
		{"EmptySource", e, &opsweb.Config{AuthFunc: auth, ReconcileSources: []string{"provider", ""}}, "empty source"},
		{"SourceTwice", e, &opsweb.Config{AuthFunc: auth, ReconcileSources: []string{"provider", "provider"}}, "twice"},
		{"RunbookFragment", e, &opsweb.Config{AuthFunc: auth, RunbookURL: "https://example.com/runbook.md#top"}, "RunbookURL"},
		{"RunbookRelative", e, &opsweb.Config{AuthFunc: auth, RunbookURL: "docs/runbook.md"}, "RunbookURL"},
		{"RunbookScheme", e, &opsweb.Config{AuthFunc: auth, RunbookURL: "javascript:alert(1)"}, "RunbookURL"},
		{"RunbookNoHost", e, &opsweb.Config{AuthFunc: auth, RunbookURL: "https:///runbook.md"}, "RunbookURL"},
		{"RunbookOnThisServer", e, &opsweb.Config{AuthFunc: auth, RunbookURL: "/docs/runbook.html"}, ""},
		{"Defaults", e, &opsweb.Config{AuthFunc: auth}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h, err := opsweb.New(tt.e, tt.cfg)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				require.Nil(t, h)
				return
			}
			require.NoError(t, err)
			require.NotNil(t, h)
		})
	}
}

// TestTokenAuth: the token as Basic's password with any user name, or as a
// bearer token; nothing else.
func TestTokenAuth(t *testing.T) {
	t.Parallel()
	auth := opsweb.TokenAuth("s3cret")
	for _, tt := range []struct {
		name    string
		headers []string
		ok      bool
	}{
		{"Bearer", []string{"Bearer s3cret"}, true},
		{"BearerAnyCase", []string{"bearer \ts3cret "}, true},
		{"BasicAnyUser", []string{basic("ann", "s3cret")}, true},
		{"BasicNoUser", []string{basic("", "s3cret")}, true},
		{"None", nil, false},
		{"WrongBearer", []string{"Bearer s3cre"}, false},
		{"WrongPassword", []string{basic("s3cret", "x")}, false},
		{"TokenAsUser", []string{basic("s3cret", "")}, false},
		{"OtherScheme", []string{"Token s3cret"}, false},
		{"BearerWithSpace", []string{"Bearer s3 cret"}, false},
		{"TwoHeaders", []string{"Bearer s3cret", "Bearer s3cret"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/ops", nil)
			for _, h := range tt.headers {
				r.Header.Add("Authorization", h)
			}
			err := auth(r)
			if tt.ok {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, opsweb.ErrUnauthenticated)
			}
		})
	}
	r := httptest.NewRequest(http.MethodGet, "/ops", nil)
	r.Header.Set("Authorization", "Bearer ")
	require.Error(t, opsweb.TokenAuth("")(r), "an empty token accepts nothing")
	r.SetBasicAuth("x", "")
	require.Error(t, opsweb.TokenAuth("")(r), "an empty token accepts nothing")
}

func TestAuthentication(t *testing.T) {
	t.Parallel()
	b := setup(t)

	t.Run("PagesChallenge", func(t *testing.T) {
		r := b.do(http.MethodGet, "/ops", "")
		requireError(t, r, http.StatusUnauthorized, "unauthenticated")
		require.Contains(t, r.header.Get("WWW-Authenticate"), "Basic realm=")
		r = b.do(http.MethodGet, "/ops/operations/"+uuidString(), "", "Authorization", "Bearer demo-token-a")
		requireError(t, r, http.StatusUnauthorized, "unauthenticated")
		require.Contains(t, r.header.Get("WWW-Authenticate"), "Basic")
	})
	t.Run("BrowserGetsHTML", func(t *testing.T) {
		r := b.do(http.MethodGet, "/ops", "", "Accept", "text/html")
		require.Equal(t, http.StatusUnauthorized, r.status)
		require.Contains(t, r.header.Get("WWW-Authenticate"), "Basic")
		require.Equal(t, "text/html; charset=utf-8", r.header.Get("Content-Type"))
		require.Contains(t, r.body, "unauthenticated")
	})
	t.Run("APINoChallenge", func(t *testing.T) {
		r := b.do(http.MethodGet, "/admin/operations", "", "Authorization", basic("ann", "wrong"))
		requireError(t, r, http.StatusUnauthorized, "unauthenticated")
		require.Empty(t, r.header.Get("WWW-Authenticate"))
		r = b.do(http.MethodPost, "/admin/operations/"+uuidString()+"/cancel", "{}", "Accept", "text/html")
		requireError(t, r, http.StatusUnauthorized, "unauthenticated")
	})
	t.Run("BasicOrBearer", func(t *testing.T) {
		r := b.do(http.MethodGet, "/admin/operations", "", "Authorization", basic("whoever", adminToken))
		require.Equal(t, http.StatusOK, r.status, r.body)
		r = b.do(http.MethodGet, "/ops", "", "Authorization", "Bearer "+adminToken)
		require.Equal(t, http.StatusOK, r.status, r.body)
	})
	t.Run("RoutesAfterAuthentication", func(t *testing.T) {
		requireError(t, b.do(http.MethodGet, "/admin/nothing", ""), http.StatusUnauthorized, "unauthenticated")
		requireError(t, b.admin(http.MethodGet, "/admin/nothing", ""), http.StatusNotFound, "not_found")
		requireError(t, b.admin(http.MethodDelete, "/admin/operations", ""), http.StatusMethodNotAllowed, "method_not_allowed")
		requireError(t, b.admin(http.MethodGet, "/admin/operations/"+uuidString()+"/retry", ""), http.StatusMethodNotAllowed, "method_not_allowed")
		requireError(t, b.admin(http.MethodPut, "/ops", ""), http.StatusMethodNotAllowed, "method_not_allowed")
	})
}

func uuidString() string { return "0190f0e4-3b7a-7c1e-9d2a-5f4e3d2c1b0a" }

func TestListAPI(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ok := b.start("client-a", "k-ok", modeOK)
	failed := b.start("client-b", "k-fail", modeFail)
	parked := b.start("client-a", "k-halt", modeHaltBefore)
	require.Equal(t, engine.StatusSucceeded, ok.Status)
	require.Equal(t, engine.StatusFailed, failed.Status)
	require.True(t, parked.Parked)

	t.Run("All", func(t *testing.T) {
		items, _ := b.list("")
		require.Equal(t, []string{parked.ID.String(), failed.ID.String(), ok.ID.String()}, ids(items), "newest first")
		it := items[1]
		require.Equal(t, item{OperationID: failed.ID.String(), Client: "client-b", Name: "payment", Version: 1, Key: "k-fail",
			Status: "failed", CreatedAt: it.CreatedAt, FinishedAt: it.FinishedAt}, it)
		require.NotNil(t, it.FinishedAt)
		require.True(t, items[0].NeedsAttention)
	})
	t.Run("ExactMembers", func(t *testing.T) {
		r := b.admin(http.MethodGet, "/admin/operations?limit=1", "")
		require.Equal(t, http.StatusOK, r.status)
		require.Regexp(t, `^\{"operations":\[\{"operationId":"[^"]+","client":"client-a","name":"payment","version":1,"key":"k-halt","status":"in_progress","needsAttention":true,"createdAt":"[^"]+","finishedAt":null\}\]\}\n$`, r.body)
	})
	t.Run("Filters", func(t *testing.T) {
		for _, tt := range []struct {
			query string
			want  []string
		}{
			{"?status=failed", []string{failed.ID.String()}},
			{"?status=in_progress", []string{parked.ID.String()}},
			{"?status=succeeded&client=client-a", []string{ok.ID.String()}},
			{"?client=client-a", []string{parked.ID.String(), ok.ID.String()}},
			{"?client=nobody", []string{}},
			{"?name=payment&needsAttention=true", []string{parked.ID.String()}},
			{"?needsAttention=false", []string{parked.ID.String(), failed.ID.String(), ok.ID.String()}},
			{"?name=refund", []string{}},
			{"?olderThan=1h", []string{}},
			{"?olderThan=1ns", []string{parked.ID.String(), failed.ID.String(), ok.ID.String()}},
		} {
			items, _ := b.list(tt.query)
			require.Equal(t, tt.want, ids(items), tt.query)
		}
	})
	t.Run("Pages", func(t *testing.T) {
		var got []string
		next := "/admin/operations?client=client-a&limit=1"
		for i := 0; next != ""; i++ {
			require.Less(t, i, 5, "pages never end")
			items, r := b.list(strings.TrimPrefix(next, "/admin/operations"))
			got = append(got, ids(items)...)
			next = ""
			if link := r.header.Get("Link"); link != "" {
				require.Regexp(t, `^<(/admin/operations\?[^>]+)>; rel="next"$`, link)
				next = strings.TrimSuffix(strings.TrimPrefix(link, "<"), `>; rel="next"`)
				require.Contains(t, next, "client=client-a", "the next page keeps the filters")
			}
		}
		require.Equal(t, []string{parked.ID.String(), ok.ID.String()}, got)
	})
	t.Run("BadParameters", func(t *testing.T) {
		for query, param := range map[string]string{
			"?status=done":                  "status",
			"?olderThan=yesterday":          "olderThan",
			"?olderThan=-1h":                "olderThan",
			"?needsAttention=maybe":         "needsAttention",
			"?limit=0":                      "limit",
			"?limit=1001":                   "limit",
			"?after=x":                      "after",
			"?after=" + uuidString():        "after",
			"?status=failed&status=failed":  "status",
			"?state=failed":                 "state",
			"?client=a&limit=2&scope=other": "scope",
		} {
			r := b.admin(http.MethodGet, "/admin/operations"+query, "")
			require.Equal(t, param, requireError(t, r, http.StatusBadRequest, "invalid_request").Param, query)
		}
	})
}

func TestOperationAPI(t *testing.T) {
	t.Parallel()
	b := setup(t)
	failed := b.start("client-b", "k-fail", modeFail)

	r := b.admin(http.MethodGet, "/admin/operations/"+failed.ID.String(), "")
	require.Equal(t, failed.ID.String(), r.header.Get("Operation-Id"))
	op := decode[operation](t, r)
	require.Equal(t, "failed", op.Status)
	require.Equal(t, "client-b", op.Client)
	require.False(t, op.Parked)
	require.Nil(t, op.Attention)
	require.NotNil(t, op.Failure)
	require.EqualValues(t, engine.CodeAttemptsExhausted, op.Failure.Code)
	require.Equal(t, "charge", op.Failure.Step)
	require.True(t, op.Failure.ServerFault)
	require.Contains(t, op.Failure.Cause, "connection refused", "the operators' cause")
	require.NotContains(t, op.Failure.Message, "10.0.0.7", "the client's message names nothing internal")
	require.Len(t, op.Steps, 3)
	require.Equal(t, []string{"reserve", "charge", "record"}, []string{op.Steps[0].Name, op.Steps[1].Name, op.Steps[2].Name})
	require.Equal(t, []string{"compensated", "failed", "skipped"}, []string{op.Steps[0].Status, op.Steps[1].Status, op.Steps[2].Status})
	charge := op.Steps[1]
	require.Equal(t, "external", charge.Kind)
	require.Equal(t, 2, charge.Attempts)
	require.Equal(t, failed.Steps[1].DerivedKey, charge.DerivedKey)
	require.True(t, strings.HasPrefix(charge.DerivedKey, "idf3_"), charge.DerivedKey)
	require.NotNil(t, charge.LastCause)
	require.Contains(t, *charge.LastCause, "dial tcp 10.0.0.7:443")
	require.NotNil(t, charge.LastError)
	require.NotContains(t, *charge.LastError, "10.0.0.7")
	require.Empty(t, op.Steps[0].DerivedKey, "a transactional step has no derived key")

	requireError(t, b.admin(http.MethodGet, "/admin/operations/"+uuidString(), ""), http.StatusNotFound, "operation_not_found")
	requireError(t, b.admin(http.MethodGet, "/admin/operations/not-a-uuid", ""), http.StatusNotFound, "operation_not_found")
}

func TestRetryAPI(t *testing.T) {
	t.Parallel()
	b := setup(t)
	failed := b.start("client-b", "k-fail", modeFail)
	path := "/admin/operations/" + failed.ID.String() + "/retry"

	requireError(t, b.admin(http.MethodPost, path, `{"reason": 1}`), http.StatusBadRequest, "invalid_request")
	requireError(t, b.admin(http.MethodPost, path, `{"because":"x"}`), http.StatusBadRequest, "invalid_request")
	requireError(t, b.admin(http.MethodPost, path, strings.Repeat(" ", 17<<10)), http.StatusRequestEntityTooLarge, "request_too_large")

	b.healed.Store("k-fail", true)
	// Its client was told of a server fault: only a forced retry reopens it.
	requireError(t, b.admin(http.MethodPost, path, ""), http.StatusConflict, "operation_final")
	requireError(t, b.admin(http.MethodPost, "/admin/operations/"+failed.ID.String()+"/cancel", `{"force": true}`), http.StatusBadRequest, "invalid_request")
	op := decode[operation](t, b.admin(http.MethodPost, path, `{"force": true}`))
	require.Contains(t, []string{"in_progress", "succeeded"}, op.Status, "reopened")
	require.Nil(t, op.Failure)

	info := b.waitFor(failed.ID.String())
	require.Equal(t, engine.StatusSucceeded, info.Status)
	require.Equal(t, engine.StepStatusSucceeded, info.Steps[1].Status)
	require.Equal(t, engine.ResolvedByCall, info.Steps[1].ResolvedBy)
	require.Equal(t, failed.Steps[1].DerivedKey, info.Steps[1].DerivedKey, "the same derived key")

	requireError(t, b.admin(http.MethodPost, path, ""), http.StatusConflict, "operation_not_failed")
	requireError(t, b.admin(http.MethodPost, "/admin/operations/"+uuidString()+"/retry", ""), http.StatusNotFound, "operation_not_found")
}

func TestCancelAPI(t *testing.T) {
	t.Parallel()
	b := setup(t)

	t.Run("BeforeThePivot", func(t *testing.T) {
		parked := b.start("client-a", "k-before", modeHaltBefore)
		require.True(t, parked.Parked)
		r := b.admin(http.MethodPost, "/admin/operations/"+parked.ID.String()+"/cancel", `{"reason":"customer withdrew"}`)
		op := decode[operation](t, r)
		require.Equal(t, "failed", op.Status)
		require.NotNil(t, op.Failure)
		require.EqualValues(t, engine.CodeCancelled, op.Failure.Code)
		require.Equal(t, "customer withdrew", op.Failure.Cause)
		requireError(t, b.admin(http.MethodPost, "/admin/operations/"+parked.ID.String()+"/cancel", ""), http.StatusConflict, "operation_finished")
	})
	t.Run("PastThePivot", func(t *testing.T) {
		parked := b.start("client-a", "k-after", modeHaltAfter)
		require.True(t, parked.Parked)
		require.Equal(t, engine.StepStatusSucceeded, parked.Steps[1].Status, "charged")
		path := "/admin/operations/" + parked.ID.String()
		e := requireError(t, b.admin(http.MethodPost, path+"/cancel", ""), http.StatusConflict, "past_point_of_no_return")
		require.Contains(t, e.Message, "point of no return")
		op := decode[operation](t, b.admin(http.MethodGet, path, ""))
		require.Equal(t, "in_progress", op.Status, "nothing changed")
		require.True(t, op.Parked)
		require.EqualValues(t, "ledger_mismatch", op.Attention.Code)

		// Resolve: a reason is required, and a step that does not call out
		// is no call to resolve; every refusal is in the audit trail.
		requireError(t, b.admin(http.MethodPost, path+"/resolve", `{"outcome": "made"}`), http.StatusBadRequest, "invalid_request")
		requireError(t, b.admin(http.MethodPost, path+"/resolve", `{"outcome": "maybe", "reason": "x"}`), http.StatusBadRequest, "invalid_request")
		requireError(t, b.admin(http.MethodPost, path+"/resolve", `{"outcome": "not_made", "reference": "r", "reason": "x"}`), http.StatusBadRequest, "invalid_request")
		requireError(t, b.admin(http.MethodPost, path+"/resolve", `{"outcome": "made", "reference": "r", "reason": "the bank says so", "actor": "bob"}`),
			http.StatusConflict, "not_resolvable")
		op = decode[operation](t, b.admin(http.MethodGet, path, ""))
		last := op.Audit[len(op.Audit)-1]
		require.Equal(t, "resolve", last.Action)
		require.Equal(t, "bob", last.Actor)
		require.Equal(t, "the bank says so", last.Reason)
		require.Equal(t, "refused", last.Result)
		require.Equal(t, "cancel", op.Audit[0].Action)
		require.Equal(t, "refused", op.Audit[0].Result)

		b.healed.Store("k-after", true)
		decode[operation](t, b.admin(http.MethodPost, path+"/retry", ""))
		require.Equal(t, engine.StatusSucceeded, b.waitFor(parked.ID.String()).Status)
	})
	// The outside service holds another call under the charge's key: the
	// operation is parked, and cancel, resolve and retry have no way out
	// yet. No answer names the service's internal URL, which the engine's
	// errors carry (issue 36, finding 8); each names the runbook's section.
	t.Run("MismatchedCall", func(t *testing.T) {
		parked := b.start("client-a", "k-mismatch", modeMismatch)
		require.True(t, parked.Parked)
		path := "/admin/operations/" + parked.ID.String()
		runbook := opsweb.DefaultRunbookURL + "#charge_mismatch"

		e := requireError(t, b.admin(http.MethodPost, path+"/cancel", `{"reason":"customer withdrew"}`), http.StatusConflict, "past_point_of_no_return")
		requireNoAddress(t, e.Message)
		require.Contains(t, e.Message, "charge_mismatch")
		require.True(t, strings.HasSuffix(e.Message, "; the operation needs attention (charge_mismatch), see "+runbook), e.Message)
		for _, body := range []string{`{"outcome":"made","reason":"the network says so"}`, `{"outcome":"not_made","reason":"the network says so"}`} {
			e := requireError(t, b.admin(http.MethodPost, path+"/resolve", body), http.StatusConflict, "resolution_contradicts_provider")
			requireNoAddress(t, e.Message)
			require.Contains(t, e.Message, runbook)
		}
		decode[operation](t, b.admin(http.MethodPost, path+"/retry", `{"reason":"try again"}`))
		again := b.waitFor(parked.ID.String())
		require.True(t, again.Parked, "parked again")
		require.EqualValues(t, "charge_mismatch", again.Attention.Code)

		op := decode[operation](t, b.admin(http.MethodGet, path, ""))
		require.Equal(t, "in_progress", op.Status)
		require.Len(t, op.Audit, 4)
		for _, a := range op.Audit {
			requireNoAddress(t, a.Detail)
		}
		require.Contains(t, op.Audit[0].Detail, "charge_mismatch", "the cancel's refusal, as the engine recorded it")
		// The page's audit trail, and a refusal of its form, too.
		r := b.browser(http.MethodPost, "/ops/operations/"+parked.ID.String()+"/cancel", url.Values{"reason": {"no"}})
		requirePage(t, r, http.StatusConflict)
		requireNoAddress(t, between(t, r.body, `<p class="flash error" role="alert">`, `</p>`))
		requireNoAddress(t, between(t, r.body, `<table id="audit">`, `</table>`))
	})
	t.Run("BadBodies", func(t *testing.T) {
		path := "/admin/operations/" + uuidString() + "/cancel"
		requireError(t, b.admin(http.MethodPost, path, `{"reason": 1}`), http.StatusBadRequest, "invalid_request")
		requireError(t, b.admin(http.MethodPost, path, `{"reason": "a"} {}`), http.StatusBadRequest, "invalid_request")
		e := requireError(t, b.admin(http.MethodPost, path, `{"reason":"`+strings.Repeat("x", 1001)+`"}`), http.StatusBadRequest, "invalid_request")
		require.Equal(t, "reason", e.Param)
		requireError(t, b.admin(http.MethodPost, path, ""), http.StatusNotFound, "operation_not_found")
	})
}

// TestCrossOrigin: a state-changing request that a browser sends from another
// site is refused before it reaches the engine, whatever credentials the
// browser adds; a same-origin one and a program's pass.
func TestCrossOrigin(t *testing.T) {
	t.Parallel()
	b := setup(t)
	parked := b.start("client-a", "k-before", modeHaltBefore)
	for _, path := range []string{"/admin/operations/" + parked.ID.String() + "/cancel", "/ops/operations/" + parked.ID.String() + "/cancel"} {
		for _, header := range [][]string{
			{"Sec-Fetch-Site", "cross-site"},
			{"Sec-Fetch-Site", "same-site"},
			{"Origin", "https://attacker.example"},
		} {
			r := b.do(http.MethodPost, path, "reason=x", append([]string{"Authorization", basic("ops", adminToken),
				"Content-Type", "application/x-www-form-urlencoded"}, header...)...)
			requireError(t, r, http.StatusForbidden, "cross_origin_request")
		}
	}
	op := decode[operation](t, b.admin(http.MethodGet, "/admin/operations/"+parked.ID.String(), ""))
	require.Equal(t, "in_progress", op.Status, "nothing was cancelled")

	r := b.do(http.MethodPost, "/ops/operations/"+parked.ID.String()+"/cancel", url.Values{"reason": {"same origin"}}.Encode(),
		"Authorization", basic("ops", adminToken), "Content-Type", "application/x-www-form-urlencoded",
		"Sec-Fetch-Site", "same-origin", "Origin", b.srv.URL)
	require.Equal(t, http.StatusSeeOther, r.status, r.body)
	op = decode[operation](t, b.admin(http.MethodGet, "/admin/operations/"+parked.ID.String(), ""))
	require.Equal(t, "failed", op.Status)
	require.Equal(t, "same origin", op.Failure.Cause)
}

// TestDefaultPaths: the pages at /ops, the JSON API at /ops/api.
func TestDefaultPaths(t *testing.T) {
	t.Parallel()
	e := idemflowtest.Engine(t, idemflowtest.Pool(t, nil), nil)
	h, err := opsweb.New(e, &opsweb.Config{AuthFunc: opsweb.TokenAuth(adminToken)})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	b := &bundle{t: t, srv: srv}
	requireError(t, b.admin(http.MethodGet, "/admin/operations", ""), http.StatusNotFound, "not_found")
	r := b.admin(http.MethodGet, "/ops/api/operations", "")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.JSONEq(t, `{"operations":[]}`, r.body)
	r = b.admin(http.MethodGet, "/ops/", "", "Accept", "text/html")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, "No operation matches.")
}

// requireNoAddress requires an operator's answer that names no internal URL
// or address.
func requireNoAddress(t *testing.T, text string) {
	t.Helper()
	require.NotContains(t, text, "10.0.0.7")
	require.NotContains(t, text, "http://")
}
