package opsweb_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/opsweb"
)

// TestServedByAdmin: the pages and the API served from an Admin, with none
// of the service's definitions, beside a live process of the service: they
// read what an Engine's do, and a retry and its refusal are the live
// process's, answered as the Engine's pages answer them.
func TestServedByAdmin(t *testing.T) {
	t.Parallel()
	b := setup(t) // a live process of the service, with its own pages
	failed := b.start("client-b", "k-fail", modeFail)
	admin, err := engine.NewAdmin(t.Context(), b.pool)
	require.NoError(t, err)
	h, err := opsweb.New(admin, &opsweb.Config{AuthFunc: opsweb.TokenAuth(adminToken), APIPath: "/admin",
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/ops", h)
	mux.Handle("/ops/", h)
	mux.Handle("/admin/", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	ops := &bundle{t: t, e: b.e, pool: b.pool, srv: srv}

	list := ops.browser(http.MethodGet, "/ops", nil)
	require.Equal(t, http.StatusOK, list.status, list.body)
	require.Contains(t, list.body, failed.ID.String())
	page := ops.browser(http.MethodGet, "/ops/operations/"+failed.ID.String(), nil)
	require.Equal(t, http.StatusOK, page.status, page.body)
	require.Contains(t, page.body, "charge")

	path := "/admin/operations/" + failed.ID.String() + "/retry"
	// The process refuses it (its client was told of a server fault): the
	// Admin's page answers with the same refusal.
	b.healed.Store("k-fail", true)
	requireError(t, ops.admin(http.MethodPost, path, ""), http.StatusConflict, "operation_final")
	op := decode[operation](t, ops.admin(http.MethodPost, path, `{"force": true, "reason": "the card network is back"}`))
	require.Contains(t, []string{"in_progress", "succeeded"}, op.Status, "reopened by the live process")
	require.Equal(t, engine.StatusSucceeded, b.waitFor(failed.ID.String()).Status)
	requireError(t, ops.admin(http.MethodPost, path, ""), http.StatusConflict, "operation_not_failed")

	// A run of reconciliation needs the application's sources: not an Admin's.
	r := ops.admin(http.MethodPost, "/admin/reconciliation/provider/run", "")
	require.NotEqual(t, http.StatusOK, r.status)
	require.False(t, strings.Contains(r.body, "panic"))
}
