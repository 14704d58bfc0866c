package payout

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/steps/httpstep"
)

// The codes of the errors that end a payout (engine.PermanentError.Code) or
// park it (engine.Attention.Code). Besides these, a payout that waits for
// approval (Config.ApprovalThreshold) and is rejected fails with the engine's
// engine.CodeRejected, and one whose wait expires (Config.ApprovalExpires)
// with engine.CodeApprovalExpired: business answers, after which the wallet
// is credited back.
const (
	// CodeInvalidPayout: the input is not a payout (no wallet, no destination,
	// an amount that is not positive). Nothing moved.
	CodeInvalidPayout = "invalid_payout"
	// CodeWalletNotFound: the wallet does not exist. Nothing moved.
	CodeWalletNotFound = "wallet_not_found"
	// CodeInsufficientFunds: the wallet has less than the amount. Nothing moved,
	// and the bank was not called.
	CodeInsufficientFunds = "insufficient_funds"
	// CodeDeclined is the code of the bank's decline (a 4xx answer
	// {"code": "declined"}): the wallet was credited back. Other refusals of the
	// bank (any 4xx but 408, 409, 425 and 429) end the payout the same way,
	// with the bank's own code.
	CodeDeclined = "declined"
	// CodeBankMismatch (attention, parked): the bank answered, under the
	// payout's key, a payout other than the one asked for (another amount,
	// wallet, destination or reference), or refused the key as used for another
	// request. Money moved that nobody may act on by rule: nothing is retried or
	// credited back until an operator looks.
	CodeBankMismatch = "bank_mismatch"
)

// The versions of the payout operation's definition (Config.Version).
const (
	// V1 is debit, bank, mark_paid: the definition of the payouts started
	// before approvals and release dates. Define it beside V2 until no payout
	// started on it is unfinished; start no payout on it.
	V1 = 1
	// V2 adds approval and release between debit and bank. New payouts start
	// on it.
	V2 = 2
)

// Name is the operation type's name.
const Name = "payout"

// Input is a payout asked for: Amount from the wallet Wallet to the bank
// account Destination.
type Input struct {
	// Wallet is the id of the wallet to pay from (payout_wallet.id).
	Wallet string `json:"wallet"`
	// Amount is how much to pay, in minor units. It must be positive.
	Amount int64 `json:"amount"`
	// Destination is the bank account to pay to, as the bank names it (an
	// IBAN, say).
	Destination string `json:"destination"`
	// ReleaseAt, when set, is the moment before which the money does not
	// leave: the payout is debited (the funds held) and approved if it must
	// be, then waits until ReleaseAt, by the database's clock, before the
	// bank is called. The zero time (the default), or a moment past, does not
	// wait. Only V2 has a release date: V1 refuses one (CodeInvalidPayout).
	ReleaseAt time.Time `json:"releaseAt,omitzero"`
}

// Validate checks the input's form: a wallet, a destination and a positive
// amount. It returns nil or an engine.Fail with CodeInvalidPayout. The debit
// step calls it, so an invalid input fails the payout with nothing moved; an
// HTTP layer may call it before engine.Start, so that an invalid request does
// not take the client's key.
func (in Input) Validate() error {
	switch {
	case in.Wallet == "":
		return engine.Fail(CodeInvalidPayout, "a payout needs a wallet")
	case in.Destination == "":
		return engine.Fail(CodeInvalidPayout, "a payout needs a destination")
	case in.Amount <= 0:
		return engine.Fail(CodeInvalidPayout, fmt.Sprintf("a payout's amount must be positive, not %d", in.Amount))
	}
	return nil
}

// State is what the payout's steps learn, as the engine stores it after each
// step.
type State struct {
	// PayoutID is our id of the payout (payout.id), the operation's id, set by
	// the debit step. It is the payout's reference at the bank.
	PayoutID string `json:"payoutId"`
	// Balance is the wallet's balance right after the debit.
	Balance int64 `json:"balance"`
	// Bank is the payout the bank made, as it answered it (set by the bank
	// step).
	Bank BankPayout `json:"bank"`
}

// BankPayout is a payout as the bank answers it: its id, and the payout it
// made, which the bank step compares with the one it asked for.
type BankPayout struct {
	// ID is the bank's id of the payout.
	ID string `json:"id"`
	// Reference, Wallet, Amount and Destination are the payout as the bank
	// made it: Reference is the PayoutID it was asked for under.
	Reference   string `json:"reference"`
	Wallet      string `json:"wallet"`
	Amount      int64  `json:"amount"`
	Destination string `json:"destination"`
}

// Result is a payout made.
type Result struct {
	// PayoutID is our id of the payout (payout.id), the operation's id.
	PayoutID string `json:"payoutId"`
	// BankPayoutID is the bank's id of the payout.
	BankPayoutID string `json:"bankPayoutId"`
	Wallet       string `json:"wallet"`
	Amount       int64  `json:"amount"`
	// Balance is the wallet's balance right after the debit.
	Balance int64 `json:"balance"`
}

// Config configures the payout operation.
type Config struct {
	// BankURL is the base URL of the bank's API, such as
	// "https://bank.example/v1": payouts are POSTed to BankURL+"/payouts", and
	// looked up at BankURL+"/by-key/<key>" (see the package documentation,
	// "The bank"). Required: an absolute http or https URL.
	BankURL string
	// Client sends the requests to the bank. It should have a timeout, and not
	// follow redirects. Defaults to httpstep's client (a timeout of
	// httpstep.DefaultTimeout, redirects not followed).
	Client *http.Client
	// ApprovalThreshold is the amount, in minor units, from which a payout
	// waits for approval after its debit and before the bank is called:
	// Approvers distinct operators must approve it (engine.Engine.Approve),
	// and one who rejects it (engine.Engine.Reject) fails it with
	// engine.CodeRejected and has the wallet credited back. Zero (the
	// default) means no payout waits for approval.
	ApprovalThreshold int64
	// Approvers is how many distinct operators must approve a payout at or
	// above ApprovalThreshold. Defaults to 1.
	Approvers int
	// ApprovalExpires is how long a payout waits for its approvals, from the
	// moment it starts to wait: once it has passed, the payout fails with
	// engine.CodeApprovalExpired and the wallet is credited back, and a late
	// approval is refused (engine.ErrWaitOver). Zero (the default) means the
	// wait does not expire: the funds stay held until an operator decides.
	ApprovalExpires time.Duration
	// Version is the version of the payout operation that New defines: V1 or
	// V2 (see the package documentation, "Versions"). Zero means V2, on which
	// new payouts start.
	Version int
}

// New returns the payout operation type, to give to engine.Config.Operations
// and start with engine.Start: version cfg.Version, V2 by default. It returns
// an error when cfg.BankURL is not an absolute http or https URL, a number of
// cfg is negative, or cfg.Version is neither V1 nor V2.
func New(cfg Config) (*engine.Operation[Input, State, Result], error) {
	u, err := url.Parse(cfg.BankURL)
	if err != nil {
		return nil, fmt.Errorf("payout: BankURL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("payout: BankURL %q is not an absolute http or https URL", cfg.BankURL)
	}
	switch {
	case cfg.ApprovalThreshold < 0:
		return nil, fmt.Errorf("payout: ApprovalThreshold %d is negative", cfg.ApprovalThreshold)
	case cfg.Approvers < 0:
		return nil, fmt.Errorf("payout: Approvers %d is negative", cfg.Approvers)
	case cfg.ApprovalExpires < 0:
		return nil, fmt.Errorf("payout: ApprovalExpires %s is negative", cfg.ApprovalExpires)
	}
	version := cfg.Version
	if version == 0 {
		version = V2
	}
	b := bank{base: strings.TrimRight(cfg.BankURL, "/")}
	// Compensatable: the credit undoes it, before the pivot.
	debitStep := engine.TxStep("debit", debit).Compensate(credit)
	// The pivot: an external step without a compensation. Once the bank has
	// paid, the payout only goes forward.
	bankStep := httpstep.Step("bank", httpstep.Call[Input, State]{
		Client:       cfg.Client,
		RequestFunc:  b.request,
		ClassifyFunc: classify,
		DecodeFunc:   decode,
		CheckFunc:    check,
		Lookup: &httpstep.Lookup[Input, State]{
			URLFunc: b.lookupURL,
			// Only the bank's own "no payout under this key" is a payout not
			// made: a 404 from a wrong URL or a proxy says nothing, and taking
			// it for "not made" would credit back a payout that the bank made.
			NotFoundFunc: httpstep.HasCode("not_found"),
		},
	})
	// Retriable: after the pivot, retried until it succeeds.
	markPaidStep := engine.TxStep("mark_paid", markPaid)

	var steps []engine.Step[Input, State]
	switch version {
	case V1:
		steps = []engine.Step[Input, State]{engine.TxStep("debit", debitV1).Compensate(credit), bankStep, markPaidStep}
	case V2:
		a := approval{threshold: cfg.ApprovalThreshold, need: cmp.Or(cfg.Approvers, 1), expires: cfg.ApprovalExpires}
		steps = []engine.Step[Input, State]{
			debitStep,
			// Waits, the funds held, for the approvals a large payout needs.
			// A rejection or an expiry is a business failure: the debit is
			// compensated.
			engine.ApprovalStep("approval", a.policy),
			// A durable timer: waits, with no process busy on the payout,
			// until its release date.
			engine.TimerStep("release", release),
			bankStep,
			markPaidStep,
		}
	default:
		return nil, fmt.Errorf("payout: no version %d of the payout operation (there are %d and %d)", version, V1, V2)
	}
	op, err := engine.NewOperation(Name, steps, result, &engine.OperationOpts{Version: version})
	if err != nil {
		return nil, fmt.Errorf("payout: %w", err)
	}
	return op, nil
}

// debitSQL takes the amount from the wallet, only while it fits, and records
// the payout as pending, in one statement that answers one row whatever it did:
// the balance after the debit (NULL when nothing was debited) and whether the
// wallet exists, which tells the two refusals apart. The INSERT inserts a row
// only when the UPDATE debited one; PostgreSQL runs a data-modifying WITH to
// completion though the main query does not read it. The balance check is in
// the UPDATE's WHERE, so that two payouts from one wallet check it one after
// the other (an UPDATE that waited for another's row lock checks its WHERE
// again on the newest row).
const debitSQL = `
WITH debited AS (
    UPDATE payout_wallet
    SET balance = balance - $3, updated_at = clock_timestamp()
    WHERE id = $2 AND balance >= $3
    RETURNING id, balance
), recorded AS (
    INSERT INTO payout (id, wallet, amount, destination)
    SELECT $1::uuid, id, $3, $4 FROM debited
    RETURNING id
)
SELECT (SELECT balance FROM debited), EXISTS (SELECT 1 FROM payout_wallet WHERE id = $2)`

// debit is the debit step. It reads what its statement answered (the new
// balance, or why nothing was debited) and turns a refusal into engine.Fail,
// rather than send the statement with engine.AtCommit and refuse in SQL with
// idemflow_check (as markPaid does): the step fills the state from the
// answer, and the refusal's code and message are written in Go, where a
// reader looks for them. It costs the round trip of the statement (sent with
// BEGIN and, on a first attempt, the key's reservation): nothing next to the
// bank's call that follows.
func debit(ctx context.Context, tx engine.Tx, at engine.Attempt, in Input, s *State) error {
	if err := in.Validate(); err != nil {
		return err
	}
	s.PayoutID = at.OperationID.String()
	var balance *int64
	var walletExists bool
	if err := tx.QueryRow(ctx, debitSQL, s.PayoutID, in.Wallet, in.Amount, in.Destination).Scan(&balance, &walletExists); err != nil {
		return fmt.Errorf("payout: debit wallet %s: %w", in.Wallet, err)
	}
	switch {
	case balance != nil:
		s.Balance = *balance
		return nil
	case !walletExists:
		return engine.Fail(CodeWalletNotFound, fmt.Sprintf("wallet %s does not exist", in.Wallet))
	default:
		// Nothing was written: the engine rolls the step's transaction back.
		return engine.Fail(CodeInsufficientFunds, fmt.Sprintf("wallet %s has less than %d", in.Wallet, in.Amount))
	}
}

// debitV1 is V1's debit step: debit, but a release date, which V1 has no
// step to wait for, fails the payout with nothing moved rather than pay it
// early. No payout stored on V1 has one (the field came with V2).
func debitV1(ctx context.Context, tx engine.Tx, at engine.Attempt, in Input, s *State) error {
	if !in.ReleaseAt.IsZero() {
		return engine.Fail(CodeInvalidPayout, fmt.Sprintf("version %d of the payout has no release date; start the payout on version %d", V1, V2))
	}
	return debit(ctx, tx, at, in, s)
}

// approval is what the approval step asks of a payout.
type approval struct {
	threshold int64
	need      int
	expires   time.Duration
}

// policy asks for a.need approvals of a payout at or above the threshold,
// expiring a.expires after the step is reached (zero: never), and none of a
// smaller one (or of any, without a threshold), which then passes at once.
// The engine fixes the answer when the payout reaches the step: a change of
// Config later does not change what a waiting payout needs.
func (a approval) policy(in Input, _ *State) engine.ApprovalPolicy {
	if a.threshold == 0 || in.Amount < a.threshold {
		return engine.ApprovalPolicy{}
	}
	return engine.ApprovalPolicy{Need: a.need, Expires: engine.Deadline{After: a.expires}}
}

// release is the release step's moment: the payout's release date (the
// zero Deadline, which passes at once, when it has none).
func release(in Input, _ *State) engine.Deadline {
	return engine.Deadline{At: in.ReleaseAt}
}

// creditSQL reverses a pending payout and gives its amount back to the wallet,
// in one statement: the credit happens only with the payout's move from
// pending to reversed, so a payout is credited back at most once even if the
// statement ran again.
const creditSQL = `
WITH reversed AS (
    UPDATE payout
    SET status = 'reversed', updated_at = clock_timestamp()
    WHERE id = $1::uuid AND status = 'pending'
    RETURNING wallet, amount
)
UPDATE payout_wallet AS w
SET balance = w.balance + r.amount, updated_at = clock_timestamp()
FROM reversed AS r
WHERE w.id = r.wallet`

// credit is the debit's compensation: it runs when a later step fails the
// payout for good (the bank declined it), before the pivot only, in a
// transaction that records the compensation with it, so it takes effect once.
func credit(ctx context.Context, tx engine.Tx, _ engine.Attempt, in Input, s *State) error {
	tag, err := tx.Exec(ctx, creditSQL, s.PayoutID)
	if err != nil {
		return fmt.Errorf("payout: credit wallet %s back: %w", in.Wallet, err)
	}
	if tag.RowsAffected() != 1 {
		// The payout is not pending (or its row is gone): a broken invariant,
		// which no retry mends. The payout fails with compensation_failed, for
		// an operator.
		return engine.Permanent(fmt.Errorf("payout: credit wallet %s back: payout %s is not pending", in.Wallet, s.PayoutID))
	}
	return nil
}

// bank is the bank's API.
type bank struct{ base string }

// bankRequest is the payout asked of the bank.
type bankRequest struct {
	Reference   string `json:"reference"`
	Wallet      string `json:"wallet"`
	Amount      int64  `json:"amount"`
	Destination string `json:"destination"`
}

// request is the bank step's request: the same on every attempt (it is made
// of the input and of the state the debit checkpointed), so that the bank
// takes a retry under the derived key for the same payout.
func (b bank) request(_ context.Context, _ engine.Attempt, in Input, s *State) (httpstep.Request, error) {
	return httpstep.Request{
		Method: http.MethodPost,
		URL:    b.base + "/payouts",
		Body:   bankRequest{Reference: s.PayoutID, Wallet: in.Wallet, Amount: in.Amount, Destination: in.Destination},
	}, nil
}

// lookupURL is where the bank shows the payout made under the derived key.
func (b bank) lookupURL(at engine.Attempt, _ Input, _ *State) string {
	return b.base + "/by-key/" + url.PathEscape(at.Key)
}

// classify is httpstep.Classify (a 2xx is a success; a 4xx a refusal that
// fails the payout with the bank's code, and so credits the wallet back;
// anything else is retried with the same key), but for a refusal of the key
// itself: a bank that answers idempotency_key_reused has taken a request under
// our key with another body, which may have paid. Crediting the wallet back on
// that would be a guess, so it parks the payout instead.
func classify(a httpstep.Answer) error {
	if !a.Success() {
		if code, _ := a.ErrorBody(); code == "idempotency_key_reused" {
			return engine.Halt(CodeBankMismatch, fmt.Sprintf("the bank refused the payout's key as used for another request (%d from %s)", a.StatusCode, a.URL))
		}
	}
	return httpstep.Classify(a)
}

// bankAnswer is the body of the bank's answer to a payout, and of its lookup:
// the bank's id of the payout, and the payout as it made it.
type bankAnswer struct {
	ID      string      `json:"id"`
	Request bankRequest `json:"request"`
}

// decode reads the bank's answer, the call's or the lookup's, into the state.
// An answer that cannot be read is a transient failure, so that the next
// attempt asks the lookup: the bank may well have paid, so it must not fail
// the payout (which would credit the wallet back).
func decode(_ engine.Attempt, _ Input, s *State, a httpstep.Answer) error {
	var ans bankAnswer
	if err := json.Unmarshal(a.Body, &ans); err != nil {
		return fmt.Errorf("payout: decode the bank's answer: %w", err)
	}
	if ans.ID == "" {
		return errors.New("payout: the bank's answer has no payout id")
	}
	r := ans.Request
	s.Bank = BankPayout{ID: ans.ID, Reference: r.Reference, Wallet: r.Wallet, Amount: r.Amount, Destination: r.Destination}
	return nil
}

// check compares the payout that the bank says it made under the key with the
// one asked for. A mismatch is no success, and nothing may be credited back on
// it either (the bank did pay something): it halts the payout for an operator.
func check(in Input, s *State) error {
	got := s.Bank
	if got.Amount == in.Amount && got.Wallet == in.Wallet && got.Destination == in.Destination && got.Reference == s.PayoutID {
		return nil
	}
	return engine.Halt(CodeBankMismatch, fmt.Sprintf(
		"the bank's payout %s under the payout's key is %d from %s to %s (reference %s); asked for %d from %s to %s (reference %s)",
		got.ID, got.Amount, got.Wallet, got.Destination, got.Reference, in.Amount, in.Wallet, in.Destination, s.PayoutID))
}

// markPaidSQL records the bank's payout id against the pending payout, and
// fails for good when the payout is not pending. It goes with the step's
// checkpoint and COMMIT (engine.AtCommit): the step reads nothing from it, so
// it must fail on its own, which idemflow_check does (see docs/sql-guards.md).
const markPaidSQL = `
WITH marked AS (
    UPDATE payout
    SET status = 'paid', bank_payout_id = $2, updated_at = clock_timestamp()
    WHERE id = $1::uuid AND status = 'pending'
    RETURNING id
)
SELECT idemflow_check(EXISTS (SELECT 1 FROM marked), 'payout_not_pending',
                      format('payout %s is not pending', $1::uuid))`

// markPaid is the mark_paid step. It runs after the pivot, so it is retried
// until it succeeds; a permanent failure here (the payout is not pending: a
// broken invariant) parks the payout for an operator, with nothing undone. Its
// transaction is one round trip: the statement goes with the COMMIT.
func markPaid(ctx context.Context, tx engine.Tx, _ engine.Attempt, _ Input, s *State) error {
	if _, err := engine.AtCommit(tx).Exec(ctx, markPaidSQL, s.PayoutID, s.Bank.ID); err != nil {
		return fmt.Errorf("payout: mark payout %s paid: %w", s.PayoutID, err)
	}
	return nil
}

// result is the payout's result, stored with the last step.
func result(in Input, s *State) (Result, error) {
	return Result{PayoutID: s.PayoutID, BankPayoutID: s.Bank.ID, Wallet: in.Wallet, Amount: in.Amount, Balance: s.Balance}, nil
}
