package opsweb_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/opsweb"
	"github.com/idemflow/idemflow/reconcile"
)

// failRecord lists, under the charge's derived key of the finished operation
// info, a record that failed: a record_failed mismatch once reconciled.
func (b *bundle) failRecord(info *engine.Info, reference string) {
	b.t.Helper()
	require.Equal(b.t, "charge", info.Steps[1].Name)
	b.provider.add(reconcile.Record{Key: info.Steps[1].DerivedKey, Reference: reference, Amount: 1250,
		Status: reconcile.Failed, Data: map[string]string{"orderId": "o-7"}})
}

func TestOperationMismatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ok := b.start("client-a", "k-ok", modeOK)
	require.Equal(t, engine.StatusSucceeded, ok.Status)
	path := "/ops/operations/" + ok.ID.String()

	t.Run("None", func(t *testing.T) {
		r := b.admin(http.MethodGet, "/admin/operations/"+ok.ID.String(), "")
		require.Contains(t, r.body, `"mismatches":[]`, "an array, never null")
		r = b.browser(http.MethodGet, path, nil)
		requirePage(t, r, http.StatusOK)
		require.NotContains(t, r.body, `id="mismatches"`)
	})

	b.failRecord(ok, "re_<i>1</i>")
	_, err := b.e.Reconcile(t.Context(), "provider")
	require.NoError(t, err)

	t.Run("JSON", func(t *testing.T) {
		op := decode[operation](t, b.admin(http.MethodGet, "/admin/operations/"+ok.ID.String(), ""))
		require.Equal(t, "succeeded", op.Status)
		require.True(t, op.NeedsAttention, "a finished operation that a mismatch names needs attention")
		require.NotNil(t, op.Attention)
		require.EqualValues(t, engine.CodeReconciliationMismatch, op.Attention.Code)
		require.Len(t, op.Mismatches, 1)
		m := op.Mismatches[0]
		require.Equal(t, "provider", m.Source)
		require.Equal(t, string(reconcile.RecordFailed), m.Kind)
		require.Equal(t, ok.Steps[1].DerivedKey, m.Key)
		require.Equal(t, "re_<i>1</i>", m.Reference)
		require.Equal(t, int64(1250), m.Amount)
		require.Equal(t, "failed", m.RecordStatus)
		require.JSONEq(t, `{"orderId":"o-7"}`, string(m.Data))
		require.Equal(t, "charge", m.Step)
		require.NotEmpty(t, m.Detail)
		require.False(t, m.RecordCreatedAt.IsZero())
		require.False(t, m.FirstSeen.IsZero())
		require.False(t, m.LastSeen.Before(m.FirstSeen))
	})
	t.Run("Page", func(t *testing.T) {
		r := b.browser(http.MethodGet, path, nil)
		requirePage(t, r, http.StatusOK)
		require.Contains(t, r.body, "Needs attention: "+engine.CodeReconciliationMismatch)
		table := between(t, r.body, `<table id="mismatches">`, `</table>`)
		for _, want := range []string{"record_failed", "provider", "charge", ok.Steps[1].DerivedKey, "re_&lt;i&gt;1&lt;/i&gt;", "1250", "failed"} {
			require.Contains(t, table, want)
		}
		require.NotContains(t, r.body, "<i>1</i>", "the record's fields are escaped")
		require.Contains(t, r.body, `<a href="/ops/reconciliation">reconciliation</a>`)
	})
	t.Run("ListedAsNeedingAttention", func(t *testing.T) {
		items, _ := b.list("?needsAttention=true")
		require.Equal(t, []string{ok.ID.String()}, ids(items))
	})
}

func TestReconciliationPage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ok := b.start("client-a", "k-ok", modeOK)
	const page = "/ops/reconciliation"

	r := b.browser(http.MethodGet, "/ops", nil)
	requirePage(t, r, http.StatusOK)
	require.Contains(t, r.body, `<a href="`+page+`">reconciliation</a>`, "linked from the list")

	r = b.browser(http.MethodGet, page, nil)
	requirePage(t, r, http.StatusOK)
	section := between(t, r.body, `<section class="source" id="source-provider">`, `</section>`)
	require.Contains(t, section, "<td>never</td>", "no run yet")
	require.Contains(t, section, "No mismatch.")
	require.Contains(t, section, `<form method="post" action="/ops/reconciliation/run">`)
	require.Contains(t, section, `<input type="hidden" name="source" value="provider"><button type="submit">Run now</button>`)

	b.provider.add(reconcile.Record{Key: "outside-1", Reference: "re_outside", Amount: 300, Status: reconcile.Succeeded})
	b.failRecord(ok, "re_ok")

	t.Run("RunNowNeedsSameOrigin", func(t *testing.T) {
		for _, header := range [][]string{{"Sec-Fetch-Site", "cross-site"}, {"Origin", "https://attacker.example"}} {
			r := b.do(http.MethodPost, page+"/run", "source=provider", append([]string{"Authorization", basic("ops", adminToken),
				"Content-Type", "application/x-www-form-urlencoded"}, header...)...)
			requireError(t, r, http.StatusForbidden, "cross_origin_request")
		}
		rep, err := b.e.Reconciliation(t.Context(), "provider")
		require.NoError(t, err)
		require.Nil(t, rep.CheckedAt, "nothing ran")
		require.Empty(t, rep.Mismatches)
	})
	t.Run("RunNow", func(t *testing.T) {
		r := b.browser(http.MethodPost, page+"/run", url.Values{"source": {"provider"}})
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		require.Equal(t, page+"?ran=provider", r.header.Get("Location"))
		r = b.browser(http.MethodGet, r.header.Get("Location"), nil)
		requirePage(t, r, http.StatusOK)
		require.Contains(t, r.body, "Ran provider now")
		section := between(t, r.body, `<section class="source" id="source-provider">`, `</section>`)
		require.NotContains(t, section, "never")
		require.Contains(t, section, `<tr><th>records checked</th><td class="num">2</td></tr>`)
		require.Contains(t, section, `<tr><th>pages</th><td class="num">1</td></tr>`)
		rows := strings.Split(between(t, section, `<table class="mismatches">`, `</table>`), `<tr class="mismatch">`)[1:]
		require.Len(t, rows, 2, "oldest first")
		require.Contains(t, rows[0], "unknown_key")
		require.Contains(t, rows[0], "outside-1")
		require.Contains(t, rows[0], "<td>none</td>", "no operation holds its key")
		require.Contains(t, rows[1], "record_failed")
		require.Contains(t, rows[1], `<a class="mono" href="/ops/operations/`+ok.ID.String()+`">`, "a link to the operation it names")
		require.Contains(t, rows[1], `<span class="status st-succeeded">succeeded</span>`)
	})
	t.Run("MismatchesAPI", func(t *testing.T) {
		type page struct {
			Mismatches []mismatchItem `json:"mismatches"`
			Total      int64          `json:"total"`
			Next       *string        `json:"next"`
		}
		r := b.admin(http.MethodGet, "/admin/mismatches", "")
		body := decode[page](t, r)
		require.Len(t, body.Mismatches, 2)
		require.Equal(t, int64(2), body.Total)
		require.Nil(t, body.Next, "the last page")
		require.Empty(t, r.header.Get("Link"))
		unknown, named := body.Mismatches[0], body.Mismatches[1]
		require.Equal(t, "unknown_key", unknown.Kind)
		require.Equal(t, "outside-1", unknown.Key)
		require.Nil(t, unknown.OperationID)
		require.Empty(t, unknown.Step)
		require.Equal(t, "record_failed", named.Kind)
		require.NotNil(t, named.OperationID)
		require.Equal(t, ok.ID.String(), *named.OperationID)
		require.Equal(t, mismatchItem{mismatch: named.mismatch, OperationID: named.OperationID,
			Operation: "payment", Client: "client-a", OperationStatus: "succeeded"}, named)
		requireError(t, b.admin(http.MethodGet, "/admin/mismatches?source=provider", ""), http.StatusBadRequest, "invalid_request")

		// In pages of one: the same two, in the same order.
		r = b.admin(http.MethodGet, "/admin/mismatches?limit=1", "")
		first := decode[page](t, r)
		require.Len(t, first.Mismatches, 1)
		require.Equal(t, int64(2), first.Total)
		require.NotNil(t, first.Next)
		require.Equal(t, "</admin/mismatches?after="+*first.Next+`&limit=1>; rel="next"`, r.header.Get("Link"))
		second := decode[page](t, b.admin(http.MethodGet, "/admin/mismatches?limit=1&after="+*first.Next, ""))
		require.Len(t, second.Mismatches, 1)
		require.Nil(t, second.Next)
		require.Equal(t, body.Mismatches, append(first.Mismatches, second.Mismatches...))
		for _, q := range []string{"limit=0", "limit=1001", "limit=x", "after=nonsense", "limit=1&limit=2"} {
			requireError(t, b.admin(http.MethodGet, "/admin/mismatches?"+q, ""), http.StatusBadRequest, "invalid_request")
		}
	})
	t.Run("RunNowFails", func(t *testing.T) {
		b.provider.fail(errors.New("provider: 502 bad gateway"))
		defer b.provider.fail(nil)
		r := b.browser(http.MethodPost, page+"/run", url.Values{"source": {"provider"}})
		requirePage(t, r, http.StatusInternalServerError)
		require.Contains(t, r.body, "reconcile_failed")
		require.Contains(t, r.body, "provider: 502 bad gateway")
		require.Contains(t, r.body, "outside-1", "the page, with what is known")
		requireError(t, b.do(http.MethodPost, page+"/run", "source=provider", "Authorization", basic("x", adminToken),
			"Content-Type", "application/x-www-form-urlencoded"), http.StatusInternalServerError, "reconcile_failed")
	})
	t.Run("BadRequests", func(t *testing.T) {
		r := b.browser(http.MethodPost, page+"/run", url.Values{"source": {"nowhere"}})
		requirePage(t, r, http.StatusNotFound)
		require.Contains(t, r.body, "source_not_found")
		requireError(t, b.admin(http.MethodPost, page+"/run", ""), http.StatusBadRequest, "invalid_request")
		requireError(t, b.admin(http.MethodGet, page+"/run", ""), http.StatusMethodNotAllowed, "method_not_allowed")
		requireError(t, b.admin(http.MethodDelete, "/admin/mismatches", ""), http.StatusMethodNotAllowed, "method_not_allowed")
		// The service's own: opsweb claims neither.
		requireError(t, b.admin(http.MethodGet, "/admin/reconciliation", ""), http.StatusNotFound, "not_found")
		requireError(t, b.admin(http.MethodPost, "/admin/reconciliation/run", ""), http.StatusNotFound, "not_found")
	})
	t.Run("Sources", func(t *testing.T) {
		for _, tt := range []struct {
			name    string
			sources []string
			// want are the sections, each with a run (true) or without.
			want map[string]bool
		}{
			{"FoundByMismatch", nil, map[string]bool{"provider": true}},
			{"NotTheEngines", []string{"ghost"}, map[string]bool{"ghost": false, "provider": true}},
		} {
			t.Run(tt.name, func(t *testing.T) {
				h, err := opsweb.New(b.e, &opsweb.Config{AuthFunc: opsweb.TokenAuth(adminToken), ReconcileSources: tt.sources})
				require.NoError(t, err)
				srv := httptest.NewServer(h)
				defer srv.Close()
				r := (&bundle{t: t, srv: srv}).browser(http.MethodGet, page, nil)
				requirePage(t, r, http.StatusOK)
				require.Equal(t, len(tt.want), strings.Count(r.body, `<section class="source"`))
				for name, runs := range tt.want {
					section := between(t, r.body, `<section class="source" id="source-`+name+`">`, `</section>`)
					require.Equal(t, runs, strings.Contains(section, "Run now"), name)
					require.Equal(t, !runs, strings.Contains(section, "no reconciliation source of this name"), name)
				}
			})
		}
	})
}

// between returns what s holds from the first from to the next to.
func between(t *testing.T, s, from, to string) string {
	t.Helper()
	_, rest, ok := strings.Cut(s, from)
	require.True(t, ok, "%q not in %s", from, s)
	in, _, ok := strings.Cut(rest, to)
	require.True(t, ok, "%q not after %q", to, from)
	return in
}
