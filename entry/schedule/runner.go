package schedule

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/idemflow/idemflow/engine"
)

// The defaults of Config.
const (
	DefaultConcurrency = 4
)

// MinRetentionPeriods is how many periods the retention of a scheduled
// operation must cover at least: New refuses an operation type whose
// retention (engine.Engine.Retention) is shorter than MinRetentionPeriods *
// Config.Period (see the package documentation, "Retention").
const MinRetentionPeriods = 2

// The backoff of a slot's firing that failed for some scopes: the first retry
// after retryFirst, doubling up to retryMax, and none at or past the next
// slot's start.
const (
	retryFirst = time.Second
	retryMax   = time.Minute
)

// Config configures a Runner.
type Config[In any] struct {
	// Period is the length of a slot: a positive whole number of seconds.
	// Slots start where Slot puts them. Required.
	Period time.Duration
	// ScopesFunc returns the scopes to fire a slot for, such as every client.
	// It is called once per slot and process (again when it fails, or when
	// firing failed for scopes it returned); an error is logged and retried.
	// A scope it returns in one process and not in another is fired by the
	// first alone, which is enough. Required.
	ScopesFunc func(ctx context.Context, slot time.Time) ([]string, error)
	// InputFunc builds the operation's input for scope and slot. It must use
	// nothing but them (and constants): every process builds the input of a
	// slot, and a firing whose input differs from the first one's is refused
	// with a *engine.ReusedError (see Fire). Nil gives the zero In.
	InputFunc func(scope string, slot time.Time) In
	// Jitter, when positive, delays each process's firing of a slot by a
	// random duration below it, so that processes do not all fire at the same
	// instant. It must be shorter than Period. Defaults to none.
	Jitter time.Duration
	// Concurrency is how many scopes a process fires at once. Each firing
	// holds a connection of the engine's pool until its reservation has
	// committed (with the operation's first transactional step). Defaults to
	// DefaultConcurrency.
	Concurrency int
	// Logger receives a line per fired slot, and the failures. Defaults to
	// slog.Default().
	Logger *slog.Logger
	// Test holds knobs for tests, which production code leaves zero.
	Test TestConfig
}

// TestConfig holds the knobs of Config that exist for tests.
type TestConfig struct {
	// Clock, when set, replaces the system clock: what Run reads the time
	// from and waits on.
	Clock Clock
}

// Clock is what a Runner reads the time from and waits on.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// After returns a channel that receives once d has passed (at once when d
	// is not positive).
	After(d time.Duration) <-chan time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time                         { return time.Now() }
func (systemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

func (c Config[In]) withDefaults() Config[In] {
	if c.InputFunc == nil {
		c.InputFunc = func(string, time.Time) In { var zero In; return zero }
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Test.Clock == nil {
		c.Test.Clock = systemClock{}
	}
	return c
}

func (c Config[In]) validate() error {
	if err := checkPeriod(c.Period); err != nil {
		return err
	}
	switch {
	case c.ScopesFunc == nil:
		return errors.New("a scopes function is required")
	case c.Jitter < 0 || c.Jitter >= c.Period:
		return fmt.Errorf("the jitter (%s) must be at least zero and shorter than the period (%s)", c.Jitter, c.Period)
	case c.Concurrency < 0:
		return errors.New("the concurrency must not be negative")
	}
	return nil
}

// checkRetention says whether operations kept retention are kept long
// enough for slots of period.
func checkRetention(period, retention time.Duration) error {
	if retention < MinRetentionPeriods*period {
		return fmt.Errorf("a period of %s needs the operations kept at least %s, and the engine keeps them %s: "+
			"a slot whose operation was deleted runs again when fired; set the operation type's OperationOpts.Retention",
			period, MinRetentionPeriods*period, retention)
	}
	return nil
}

// Runner fires the slots of one operation type for a set of scopes, as they
// begin. Make one with New; it is safe for concurrent use, and so is running
// it in every process.
type Runner[In, S, Out any] struct {
	e   *engine.Engine
	op  *engine.Operation[In, S, Out]
	cfg Config[In]
}

// New returns a Runner that fires op's slot for each scope of
// cfg.ScopesFunc every cfg.Period, on e. Run it in every process: each slot
// runs once per scope however many processes fire it (see Fire). cfg is
// copied; its Period and ScopesFunc are required.
//
// It returns an error when e, op or cfg is nil, when cfg is invalid (see
// Config), when op was not given to e, and when e
// keeps op's operations less than MinRetentionPeriods periods.
func New[In, S, Out any](e *engine.Engine, op *engine.Operation[In, S, Out], cfg *Config[In]) (*Runner[In, S, Out], error) {
	switch {
	case e == nil:
		return nil, errors.New("schedule: an engine is required")
	case op == nil:
		return nil, errors.New("schedule: an operation type is required")
	case cfg == nil:
		return nil, errors.New("schedule: a config is required")
	case !e.Registered(op):
		return nil, fmt.Errorf("schedule: operation type not registered: %q", op.Name())
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("schedule: %q: %w", op.Name(), err)
	}
	if err := checkRetention(c.Period, e.Retention(op)); err != nil {
		return nil, fmt.Errorf("schedule: %q: %w", op.Name(), err)
	}
	return &Runner[In, S, Out]{e: e, op: op, cfg: c}, nil
}

// Run fires the current slot at once, then each slot as it begins (after a
// random delay below Config.Jitter), until ctx is done; then it returns ctx's
// error. It returns an error wrapping engine.ErrStopped once the engine stops.
//
// A slot is fired for every scope that Config.ScopesFunc returns for it.
// Failures are logged and do not stop Run: a scope whose firing failed for a
// reason that may pass (the database unreachable, the engine overloaded,
// ScopesFunc's error) is fired again with a backoff from 1 second to 1
// minute, until the next slot begins; one whose firing cannot succeed (a
// *engine.ReusedError) is logged as an error and left. A slot that began
// while this process was not running, or was busy past its end, is not fired
// by Run (a warning says how many were skipped): another process fired it, or
// FireSlot fires it.
//
// Firing the current slot at start makes a slot run even when every process
// was restarted across its start (a deploy); a slot is missed only when no
// process runs Run at any time during it.
func (r *Runner[In, S, Out]) Run(ctx context.Context) error {
	clock, period := r.cfg.Test.Clock, r.cfg.Period
	var last time.Time
	for {
		if slot := Slot(clock.Now(), period); slot.After(last) {
			if !last.IsZero() {
				if skipped := int(slot.Sub(last)/period) - 1; skipped > 0 {
					r.cfg.Logger.WarnContext(ctx, "schedule: slots skipped: this process was busy or asleep past their start",
						r.attrs(slot, slog.Int("skipped", skipped), slog.Time("last_fired", last))...)
				}
			}
			if err := r.runSlot(ctx, slot); err != nil {
				return err
			}
			last = slot
		}
		wait := last.Add(period).Sub(clock.Now())
		if r.cfg.Jitter > 0 {
			wait += rand.N(r.cfg.Jitter)
		}
		if err := r.sleep(ctx, wait); err != nil {
			return err
		}
	}
}

// FireSlot fires slot for every scope that Config.ScopesFunc returns for it,
// once, and returns the failures joined: the firing that Run makes at each
// slot's start, without its retries. It is for a slot that no process fired
// (every process was down through it), or for an operator; firing a slot
// again is harmless while its operations are kept (see the package
// documentation, "Retention"). slot must be a slot of the period (Slot(slot,
// Config.Period) == slot), or FireSlot returns ErrNotSlot; a slot so old that
// the engine's retention may have deleted its operations (its start a
// retention ago, less a margin for the clocks' skew) is refused with
// ErrSlotExpired, since firing it could run it again.
func (r *Runner[In, S, Out]) FireSlot(ctx context.Context, slot time.Time) error {
	if err := checkSlot(slot); err != nil {
		return err
	}
	if !Slot(slot, r.cfg.Period).Equal(slot) {
		return fmt.Errorf("schedule: %w: %s is not the start of a period of %s", ErrNotSlot, slot.UTC().Format(time.RFC3339), r.cfg.Period)
	}
	retention := r.e.Retention(r.op)
	if age := r.cfg.Test.Clock.Now().Sub(slot); age >= retention-skewMargin(retention) {
		return fmt.Errorf("schedule: %w: %s began %s ago, and %q operations are kept %s after they finish",
			ErrSlotExpired, slot.UTC().Format(time.RFC3339), age.Round(time.Second), r.op.Name(), retention)
	}
	scopes, err := r.scopes(ctx, slot)
	if err != nil {
		return fmt.Errorf("schedule: scopes of %q for slot %s: %w", r.op.Name(), slot.UTC().Format(time.RFC3339), err)
	}
	return errors.Join(r.fire(ctx, slot, scopes).errs...)
}

// runSlot fires slot for every scope, and again for the scopes whose firing
// failed for a reason that may pass, with a backoff, until it is done, the
// next slot begins, or ctx is done. It returns an error only when Run must
// end: ctx's, or the engine's stop.
func (r *Runner[In, S, Out]) runSlot(ctx context.Context, slot time.Time) error {
	clock := r.cfg.Test.Clock
	var (
		pending []string // the scopes still to fire
		asked   bool     // whether ScopesFunc has answered
	)
	for delay := retryFirst; ; delay = min(2*delay, retryMax) {
		var again error
		if !asked {
			scopes, err := r.scopes(ctx, slot)
			if err != nil {
				again = fmt.Errorf("scopes: %w", err)
			} else {
				pending, asked = scopes, true
			}
		}
		if asked {
			res := r.fire(ctx, slot, pending)
			if res.stopped != nil {
				return res.stopped
			}
			pending, again = res.retry, res.retryErr
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if again == nil {
			return nil
		}
		unfired := slog.Int("unfired", len(pending))
		if !asked {
			unfired = slog.String("unfired", "all")
		}
		if !clock.Now().Add(delay).Before(slot.Add(r.cfg.Period)) {
			r.cfg.Logger.ErrorContext(ctx, "schedule: giving up the slot at the next one's start; another process, or FireSlot, may still fire it",
				r.attrs(slot, unfired, slog.Any("error", again))...)
			return nil
		}
		r.cfg.Logger.WarnContext(ctx, "schedule: firing the slot failed; trying again",
			r.attrs(slot, unfired, slog.Duration("retry_in", delay), slog.Any("error", again))...)
		if err := r.sleep(ctx, delay); err != nil {
			return err
		}
	}
}

// fired is the outcome of one firing of a slot for a set of scopes.
type fired struct {
	created, found int
	// retry are the scopes whose firing may succeed later; retryErr is the
	// first of their errors.
	retry    []string
	retryErr error
	// errs are every scope's error.
	errs []error
	// stopped is set when the engine stopped.
	stopped error
}

// fire fires slot for scopes, Config.Concurrency at a time, in a random
// order: processes that fire the same slot at once then mostly reserve
// different scopes, sharing the work, rather than queue behind one another
// on the same keys.
func (r *Runner[In, S, Out]) fire(ctx context.Context, slot time.Time, scopes []string) fired {
	order := slices.Clone(scopes)
	rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	var (
		mu  sync.Mutex
		res fired
		wg  sync.WaitGroup
	)
	work := make(chan string)
	for range min(r.cfg.Concurrency, len(order)) {
		wg.Go(func() {
			for scope := range work {
				started, err := r.fireScope(ctx, scope, slot)
				mu.Lock()
				r.record(ctx, &res, scope, slot, started, err)
				mu.Unlock()
			}
		})
	}
send:
	for _, scope := range order {
		select {
		case work <- scope:
		case <-ctx.Done():
			break send
		}
	}
	close(work)
	wg.Wait()
	if res.stopped == nil && ctx.Err() == nil {
		r.cfg.Logger.InfoContext(ctx, "schedule: fired the slot",
			r.attrs(slot, slog.Int("scopes", len(order)), slog.Int("created", res.created), slog.Int("found", res.found), slog.Int("failed", len(res.errs)))...)
	}
	return res
}

func (r *Runner[In, S, Out]) fireScope(ctx context.Context, scope string, slot time.Time) (started *engine.Started, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("schedule: input of %q for scope %q: %w", r.op.Name(), scope, &panicError{v})
		}
	}()
	in := r.cfg.InputFunc(scope, slot)
	return Fire(ctx, r.e, r.op, scope, slot, in)
}

// record adds one scope's firing to res, and logs it.
func (r *Runner[In, S, Out]) record(ctx context.Context, res *fired, scope string, slot time.Time, started *engine.Started, err error) {
	log := r.cfg.Logger
	switch {
	case err == nil && started.Created:
		res.created++
		log.DebugContext(ctx, "schedule: started the slot's operation",
			r.attrs(slot, slog.String("scope", scope), slog.String("operation_id", started.ID.String()))...)
	case err == nil:
		res.found++
		log.DebugContext(ctx, "schedule: the slot's operation was started before",
			r.attrs(slot, slog.String("scope", scope), slog.String("operation_id", started.ID.String()))...)
	case errors.Is(err, engine.ErrStopped):
		res.errs = append(res.errs, err)
		res.stopped = err
	case ctx.Err() != nil:
		res.errs = append(res.errs, err)
	case errors.As(err, new(*engine.ReusedError)),
		errors.Is(err, engine.ErrInvalidKey), errors.As(err, new(*panicError)):
		res.errs = append(res.errs, err)
		log.ErrorContext(ctx, "schedule: the slot cannot be fired for the scope; not trying again",
			r.attrs(slot, slog.String("scope", scope), slog.Any("error", err))...)
	default:
		res.errs = append(res.errs, err)
		if res.retryErr == nil {
			res.retryErr = err
		}
		res.retry = append(res.retry, scope)
	}
}

// scopes calls Config.ScopesFunc, a panic in it made an error.
func (r *Runner[In, S, Out]) scopes(ctx context.Context, slot time.Time) (scopes []string, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &panicError{v}
		}
	}()
	return r.cfg.ScopesFunc(ctx, slot)
}

func (r *Runner[In, S, Out]) sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-r.cfg.Test.Clock.After(d):
		return nil
	}
}

func (r *Runner[In, S, Out]) attrs(slot time.Time, more ...any) []any {
	return append([]any{slog.String("operation", r.op.Name()), slog.String("slot", slot.UTC().Format(time.RFC3339))}, more...)
}

// panicError is a panic of Config's functions, recovered.
type panicError struct{ value any }

func (e *panicError) Error() string { return fmt.Sprintf("panic: %v", e.value) }
