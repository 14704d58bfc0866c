package demoapi

import (
	"net/http"

	"github.com/idemflow/idemflow/workflows/refund"
)

// maxApprovals bounds the list of GET /admin/approvals.
const maxApprovals = 1000

// approvals mounts GET /admin/approvals, behind the admin token: the
// refunds that wait, with what each asks (its order and amount), which the
// operators' generic list (opsweb's) does not know. Approving and rejecting
// (POST /admin/operations/{id}/approve and /reject) are opsweb's, as the
// other operator requests under /admin.
func (s *server) approvals() {
	s.mux.Handle("GET /admin/approvals", s.adminOnly(bounded(s.listApprovals)))
	// Behind the token even for a wrong method, as all of /admin.
	s.mux.Handle("/admin/approvals", s.adminOnly(http.HandlerFunc(methodNotAllowed)))
}

// listApprovals serves GET /admin/approvals: the refunds that wait for
// approval, oldest first.
func (s *server) listApprovals(w http.ResponseWriter, r *http.Request) {
	list, err := refund.ListApprovals(r.Context(), s.cfg.Pool, s.cfg.Engine, maxApprovals)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"approvals": list})
}
