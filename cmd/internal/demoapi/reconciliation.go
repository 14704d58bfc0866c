package demoapi

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idempotency"
	"github.com/idemflow/idemflow/workflows/refund"
)

// reconciliationBody is GET /admin/reconciliation's answer. Mismatches lists
// at most the first 1,000; total counts them all, and truncated says that
// mismatches lists fewer (GET /admin/mismatches pages through them all).
type reconciliationBody struct {
	CheckedAt  *time.Time     `json:"checkedAt"`
	Checked    int64          `json:"checked"`
	Mismatches []mismatchBody `json:"mismatches"`
	Total      int64          `json:"total"`
	Truncated  bool           `json:"truncated"`
}

// mismatchBody is one mismatch: the provider's refund, and the refund
// operation that holds its key (nulls for unknown_key). For missing_record,
// the provider has no refund: providerRefundId is the id the books hold,
// amount 0, orderId and status empty.
type mismatchBody struct {
	Kind             string     `json:"kind"`
	IdempotencyKey   string     `json:"idempotencyKey"`
	ProviderRefundID string     `json:"providerRefundId"`
	Amount           int64      `json:"amount"`
	OrderID          string     `json:"orderId"`
	Status           string     `json:"status"`
	OperationID      *uuid.UUID `json:"operationId"`
	Client           *string    `json:"client"`
	OperationStatus  *string    `json:"operationStatus"`
	Detail           string     `json:"detail"`
	FirstSeen        time.Time  `json:"firstSeen"`
	LastSeen         time.Time  `json:"lastSeen"`
}

// reconciliation mounts GET /admin/reconciliation and POST
// /admin/reconciliation/run, behind the admin token.
func (s *server) reconciliation() {
	s.mux.Handle("GET /admin/reconciliation", s.adminOnly(bounded(s.getReconciliation)))
	s.mux.Handle("POST /admin/reconciliation/run", s.adminOnly(sameOrigin(http.HandlerFunc(s.runReconciliation))))
	s.mux.Handle("/admin/reconciliation", s.adminOnly(http.HandlerFunc(methodNotAllowed)))
	s.mux.Handle("/admin/reconciliation/run", s.adminOnly(http.HandlerFunc(methodNotAllowed)))
}

// getReconciliation serves GET /admin/reconciliation: the last run's report,
// with the mismatches as they are now (those provider events found since
// included).
func (s *server) getReconciliation(w http.ResponseWriter, r *http.Request) {
	rep, err := s.cfg.Engine.Reconciliation(r.Context(), refund.ProviderSource)
	s.writeReconciliation(w, r, rep, err)
}

// runReconciliation serves POST /admin/reconciliation/run: a run now, and
// its report. A body, if any, is ignored (refusing it would end the request's
// context before the run: net/http's read of a request without one then fails
// at once).
func (s *server) runReconciliation(w http.ResponseWriter, r *http.Request) {
	rep, err := s.cfg.Engine.Reconcile(r.Context(), refund.ProviderSource)
	s.writeReconciliation(w, r, rep, err)
}

func (s *server) writeReconciliation(w http.ResponseWriter, r *http.Request, rep *engine.ReconcileReport, err error) {
	if engine.IsUnavailable(err) {
		// The database, or the provider whose records are read, did not
		// answer: a run later may.
		w.Header().Set("Retry-After", "1")
		idempotency.WriteError(w, http.StatusServiceUnavailable, "service_unavailable", "the database or the provider did not answer; try again", nil)
		return
	}
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	body := reconciliationBody{CheckedAt: rep.CheckedAt, Checked: rep.Checked, Mismatches: make([]mismatchBody, 0, len(rep.Mismatches)),
		Total: rep.Total, Truncated: rep.Truncated}
	for _, m := range rep.Mismatches {
		mb := mismatchBody{
			Kind: string(m.Kind), IdempotencyKey: m.Key, ProviderRefundID: m.Reference, Amount: m.Amount,
			Status: string(m.RecordStatus), Detail: m.Detail, FirstSeen: m.FirstSeen, LastSeen: m.LastSeen,
		}
		var d refund.RecordData
		if len(m.Data) > 0 && json.Unmarshal(m.Data, &d) == nil {
			mb.OrderID = d.OrderID
		}
		if m.OperationID != uuid.Nil {
			id := m.OperationID
			mb.OperationID = &id
			if m.Operation != "" {
				client, status := m.Scope, string(m.OperationStatus)
				mb.Client, mb.OperationStatus = &client, &status
			}
		}
		body.Mismatches = append(body.Mismatches, mb)
	}
	writeJSON(w, http.StatusOK, body)
}
