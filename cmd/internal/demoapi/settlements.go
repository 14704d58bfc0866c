package demoapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/entry/schedule"
	"github.com/idemflow/idemflow/idempotency"
	"github.com/idemflow/idemflow/opsweb"
	"github.com/idemflow/idemflow/workflows/refund"
)

// maxSettlementBody bounds the body of POST /admin/settlements.
const maxSettlementBody = 4 << 10

// settlementBody is a settlement as GET /settlements lists it.
type settlementBody struct {
	Slot        string    `json:"slot"`
	Amount      int64     `json:"amount"`
	OperationID uuid.UUID `json:"operationId"`
}

// firedBody is a client's settlement as POST /admin/settlements answers it.
type firedBody struct {
	Client      string    `json:"client"`
	OperationID uuid.UUID `json:"operationId"`
	// Created is true for the firing that started the settlement, false when
	// it found the one an earlier firing (here or in another process) started.
	Created bool `json:"created"`
	// Status is the operation's, once the answer's wait is over.
	Status string `json:"status"`
	// Amount is what it moved, once it succeeded.
	Amount *int64 `json:"amount"`
	// Error is why it failed, if it did.
	Error *string `json:"error"`
}

// formatSlot writes a slot as the API does: UTC, RFC 3339 with seconds.
func formatSlot(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// listSettlements serves GET /settlements: the calling client's settlements,
// oldest slot first.
func (s *server) listSettlements(w http.ResponseWriter, r *http.Request) {
	list, err := refund.ListSettlements(r.Context(), s.cfg.Pool, clientOf(r))
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	out := make([]settlementBody, 0, len(list))
	for _, st := range list {
		out = append(out, settlementBody{Slot: formatSlot(st.Slot), Amount: st.Amount, OperationID: st.OperationID})
	}
	writeJSON(w, http.StatusOK, map[string]any{"settlements": out})
}

// adminOnly answers 401 unless the request carries the admin token.
func (s *server) adminOnly(next http.Handler) http.Handler {
	auth := opsweb.TokenAuth(s.cfg.AdminToken)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := auth(r); err != nil {
			idempotency.RefuseBody(w)
			idempotency.WriteError(w, http.StatusUnauthorized, "unauthenticated", "this endpoint needs the admin token", nil)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// fireSettlements serves POST /admin/settlements {"slot": "..."}: it fires the
// slot's settlement for every client, as each process's schedule does at the
// slot's start, and answers once each has finished or the demo's wait is over.
// Firing a slot again, here or in another process, starts nothing: each
// (client, slot) settles once.
func (s *server) fireSettlements(w http.ResponseWriter, r *http.Request) {
	slot, ok := s.readSlot(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	fired := make([]firedBody, 0, len(s.cfg.Clients))
	for _, c := range s.cfg.Clients {
		started, err := schedule.Fire(ctx, s.cfg.Engine, s.cfg.Workflows.Settlement, c.Name, slot,
			refund.SettlementInput{Client: c.Name, Slot: slot})
		if errors.Is(err, engine.ErrOverloaded) {
			w.Header().Set("Retry-After", "1")
			idempotency.WriteError(w, http.StatusServiceUnavailable, idempotency.CodeOverloaded, "the server runs too many operations; try again", nil)
			return
		}
		if err != nil {
			s.internalError(w, r, err)
			return
		}
		fired = append(fired, s.settled(ctx, c.Name, started))
	}
	writeJSON(w, http.StatusOK, map[string]any{"slot": formatSlot(slot), "settlements": fired})
}

// settled waits, up to the demo's wait, for a fired settlement to finish, and
// says how it is.
func (s *server) settled(ctx context.Context, client string, started *engine.Started) firedBody {
	f := firedBody{Client: client, OperationID: started.ID, Created: started.Created, Status: string(engine.StatusInProgress)}
	wctx, cancel := context.WithTimeout(ctx, s.cfg.Wait)
	defer cancel()
	info, err := started.Wait(wctx)
	if err != nil {
		return f
	}
	f.Status = string(info.Status)
	switch info.Status {
	case engine.StatusSucceeded:
		if out, err := s.cfg.Workflows.Settlement.Result(info); err == nil {
			f.Amount = &out.Amount
		}
	case engine.StatusFailed:
		if info.Error != nil {
			f.Error = &info.Error.Message
		}
	}
	return f
}

// readSlot reads the body of POST /admin/settlements: a slot, RFC 3339 with
// whole seconds. On failure it answers 400 (413) and returns false.
func (s *server) readSlot(w http.ResponseWriter, r *http.Request) (time.Time, bool) {
	fail := func(message string) (time.Time, bool) {
		idempotency.WriteError(w, http.StatusBadRequest, idempotency.CodeInvalidRequest, message, map[string]any{"param": "slot"})
		return time.Time{}, false
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxSettlementBody))
	if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
		w.Header().Set("Connection", "close")
		idempotency.WriteError(w, http.StatusRequestEntityTooLarge, idempotency.CodeRequestTooLarge,
			fmt.Sprintf("the request body is larger than %d bytes", maxSettlementBody), nil)
		return time.Time{}, false
	}
	var f idempotency.Fields
	if err != nil || json.Unmarshal(data, &f) != nil || f == nil {
		idempotency.WriteError(w, http.StatusBadRequest, idempotency.CodeInvalidRequest, "the request body must be a JSON object", nil)
		return time.Time{}, false
	}
	if fe := (*idempotency.FieldError)(nil); errors.As(f.Only("slot"), &fe) {
		idempotency.WriteError(w, http.StatusBadRequest, idempotency.CodeInvalidRequest, fe.Error(), map[string]any{"param": fe.Param})
		return time.Time{}, false
	}
	var raw string
	if err := f.Required("slot", &raw); err != nil {
		return fail("slot: the field is required, a time in RFC 3339")
	}
	slot, err := time.Parse(time.RFC3339, raw)
	switch {
	case err != nil:
		return fail("slot: must be a time in RFC 3339, such as 2026-12-01T10:00:00Z")
	case slot.Nanosecond() != 0:
		return fail("slot: must be whole seconds")
	case slot.Year() < 2000 || slot.Year() > 9999:
		return fail("slot: must be a year from 2000 to 9999")
	}
	return slot.UTC(), true
}
