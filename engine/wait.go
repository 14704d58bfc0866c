package engine

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/store"
)

func (e *Engine) addWaiter(id uuid.UUID) chan *Info {
	ch := make(chan *Info, 1)
	e.mu.Lock()
	e.waiters[id] = append(e.waiters[id], ch)
	e.mu.Unlock()
	return ch
}

func (e *Engine) removeWaiter(id uuid.UUID, ch chan *Info) {
	e.mu.Lock()
	defer e.mu.Unlock()
	list := e.waiters[id]
	for i, c := range list {
		if c == ch {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(e.waiters, id)
	} else {
		e.waiters[id] = list
	}
}

// notifyFinished hands a finished operation to the waiters of this process.
func (e *Engine) notifyFinished(info *Info) {
	e.mu.Lock()
	list := e.waiters[info.ID]
	delete(e.waiters, info.ID)
	e.mu.Unlock()
	for _, ch := range list {
		ch <- info
	}
}

// Wait waits until the operation finishes or is parked and returns it, without
// its steps. A parked operation (Info.Parked, still in progress) waits for an
// operator, so Wait does not wait for it. It returns ctx's error when ctx ends
// first, and ErrNotFound when there is no such operation. An operation that
// finishes in this process is handed over the moment it does; otherwise the
// operation is read again every PollInterval at most.
func (e *Engine) Wait(ctx context.Context, id uuid.UUID) (*Info, error) {
	ch := e.addWaiter(id)
	defer e.removeWaiter(id, ch)
	delay := 10 * time.Millisecond
	for {
		rec, err := e.store.OperationGet(ctx, e.pool, id)
		if err != nil {
			return nil, mapNotFound(err)
		}
		if rec.State != store.OperationInProgress || rec.Parked {
			return infoFromRecord(rec), nil
		}
		t := time.NewTimer(delay)
		select {
		case info := <-ch:
			t.Stop()
			return info, nil
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, e.cfg.PollInterval)
	}
}
