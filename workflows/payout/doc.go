// Package payout pays money out of a wallet to a bank account through a bank's
// API, as one idemflow operation that survives retries and crashes: the wallet
// is debited once, the bank pays once, and a declined payout gives the money
// back. A large payout waits for operators' approval, and a payout with a
// release date waits for it, the funds held meanwhile. It is built on
// idemflow's public API only (engine, steps/httpstep), and tested with
// idemflowtest and its fakeservice: the example to copy for an operation of
// your own.
//
//	op, err := payout.New(payout.Config{BankURL: "https://bank.example/v1", ApprovalThreshold: 100_000})
//	err = payout.Migrate(ctx, pool) // after engine.Migrate
//	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}})
//	started, err := engine.Start(ctx, e, op, client, key, payout.Input{Wallet: "w1", Amount: 3000, Destination: "DE89..."}, nil)
//
// # Steps
//
//  1. "debit" (transactional, compensatable): in one statement, takes the
//     amount from the wallet while it fits and records the payout as pending
//     (table payout, whose id is the operation's). A wallet that has less
//     fails the payout at once with CodeInsufficientFunds, before the bank is
//     called; an unknown wallet with CodeWalletNotFound, an invalid input with
//     CodeInvalidPayout. Its compensation credits the amount back and marks the
//     payout reversed, in its own transaction, once.
//  2. "approval" (engine.ApprovalStep): a payout of Config.ApprovalThreshold
//     or more waits here for Config.Approvers distinct operators to approve
//     it; a smaller one passes at once. See "Approval".
//  3. "release" (engine.TimerStep): a payout with a release date
//     (Input.ReleaseAt) waits here until it; one without passes at once. See
//     "Release date".
//  4. "bank" (external, made with httpstep): POSTs the payout to the bank
//     under the step's derived idempotency key, the same on every attempt.
//     This is the pivot, the point of no return: it has no compensation (a
//     bank payout cannot be called back), so once it has succeeded the payout
//     only goes forward.
//  5. "mark_paid" (transactional, after the pivot): records the bank's payout
//     id against the payout row, which becomes paid. It is retried until it
//     succeeds.
//
// The result (Result) is stored with mark_paid's transaction, and a client's
// retry of its key gets it back without anything running again.
//
// Both waits come after the debit and before the bank: the money is held
// (taken from the wallet's balance, the payout row pending) while the payout
// waits, so that a payout approved, or come to its date, cannot then fail for
// want of funds; and nothing has left, so that a rejection or an expiry only
// has to give the money back. Approval comes first: an operator decides while
// the release date is still ahead, and a payout rejected does not wait for
// its date to be credited back.
//
// # Approval
//
//	op, err := payout.New(payout.Config{BankURL: url, ApprovalThreshold: 100_000, Approvers: 2, ApprovalExpires: 72 * time.Hour})
//	list, err := e.Approvals(ctx, 0)                                              // what waits, oldest first
//	info, err := e.Approve(engine.WithActor(ctx, "ann"), id, "checked the beneficiary") // one of two
//	info, err = e.Reject(engine.WithActor(ctx, "bob"), id, "unknown beneficiary")
//
// A payout whose amount is at or above Config.ApprovalThreshold (zero, the
// default: none) waits at "approval", in progress and needing no attention,
// with no process busy on it, until as many distinct operators as
// Config.Approvers (default 1) approved it; then it goes on. An operator who
// rejects it fails it with engine.CodeRejected, and one whose wait passes
// Config.ApprovalExpires (zero, the default: never) fails with
// engine.CodeApprovalExpired; either way the debit is compensated and the
// wallet credited back, once. An approval that comes after the expiry is
// refused with engine.ErrWaitOver, one after the payout ended with
// engine.ErrFinished: the first to commit, the approval or the expiry, wins.
// The number of approvals and the expiry are fixed when the payout reaches
// the step, from the Config of the process that runs it then.
//
// # Release date
//
// A payout with Input.ReleaseAt waits at "release" until that moment, by the
// database's clock: with no goroutine, lease or River job busy on it, so that
// a payout dated next month costs a row, not a process. Whichever process is
// up at the moment takes it to the bank, or the first to start after it if
// none is; it passes once. A release date in the past, or none, passes at
// once. The date is part of the input, and so of its fingerprint: a client's
// retry with another date is another payout, refused under the same key
// (engine.ReusedError).
//
// # Decline, and other failures
//
// A bank that refuses the payout (a 4xx answer other than 408, 409, 425 and
// 429, such as 422 {"code": "declined"}) fails the operation with the bank's
// code (CodeDeclined): the debit is compensated, the wallet credited back,
// and the operation ends failed with that error as its stored answer. A 5xx,
// a timeout or a lost answer is retried with the same key, after the answer's
// Retry-After; each retry first asks the bank, by key, whether the lost
// attempt paid. Out of attempts, the payout is credited back only once the
// bank's lookup has said that nothing was paid under the key.
//
// A bank that answers, under the payout's key, a payout for another amount,
// wallet, destination or reference (or refuses the key as used for another
// request) has paid something nobody may act on by rule: the operation is
// parked (engine.Info.Parked, attention CodeBankMismatch), nothing is retried
// and nothing credited back, until an operator reopens or cancels it.
//
// # Crashes
//
// A process that dies anywhere in the payout leaves it to be resumed by
// another, once its lease expires, at its first unfinished step. A debit that
// had not committed runs again (its writes commit with its checkpoint, or not
// at all); a bank step whose answer was lost asks the lookup, finds the
// payout, and does not pay again; mark_paid runs again. A crash during the
// compensation of a declined payout resumes the compensation, which credits
// the wallet back once. A payout that waits for approval or for its release
// date is held by no process: a process that dies then loses nothing, the
// approvals given are kept in the payout's rows, and whichever process is up
// (or starts first) carries the wait out, once; a crash after the wait was
// decided and before its checkpoint committed decides it again, the same
// way.
//
// # Versions
//
// The approval and release steps came with version V2 of the payout
// operation; V1, its first, is debit, bank and mark_paid. Steps put between
// others change the list that a stored payout runs by, which the engine
// allows only in a new version (see engine's package documentation,
// "Versions"): a payout started on V1 and stopped after its debit must not
// find, on its resume, an approval it never asked for before a bank call that
// may already have been made. So a payout runs to its end on the version it
// started on; New defines V2 unless Config.Version says V1, and a service
// that ran V1 defines both until none of its payouts is unfinished:
//
//	v1, err := payout.New(payout.Config{BankURL: url, Version: payout.V1}) // finishes the payouts started on V1
//	op, err := payout.New(payout.Config{BankURL: url})                     // V2: starts the new ones
//	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{v1, op}})
//
// then, once Engine.Check on an engine with V2 alone lists nothing, drops V1.
// A process with V2 alone leaves a V1 payout alone, in progress and needing
// attention (engine.CodeVersionNotRun), rather than run it on steps it did
// not start with. V1 asks for no approval, whatever Config says, and refuses
// a release date (CodeInvalidPayout) rather than pay early: start no payout
// on it. A V2 payout without approval and release date does what a V1 one
// does, with two more checkpoints. The input's new field (ReleaseAt) is left
// out of its JSON when unset, so a client's retry of a key taken before V2
// has the same fingerprint.
//
// # The bank
//
// The bank's API is the one that idemflowtest/fakeservice speaks (Stripe's
// conventions); a bank with another API changes the request, decode and
// lookupURL functions of the bank step, and nothing else:
//
//	POST <BankURL>/payouts        Idempotency-Key: <key>
//	     {"reference": "<payout id>", "wallet": "...", "amount": 3000, "destination": "..."}
//	  -> 2xx {"id": "<the bank's payout id>", "request": <the payout as made>}
//	  -> 4xx {"code": "declined", "message": "..."}: refused, nothing paid
//	GET  <BankURL>/by-key/<key>
//	  -> 200 the answer of the payout made under key
//	  -> 404 {"code": "not_found"}: nothing paid under key
//
// # Tables
//
// Migrate creates payout_wallet (id, balance, never below zero) and payout
// (one row per payout: wallet, amount, destination, status pending, paid or
// reversed, and the bank's payout id), with their own version table. Funding
// wallets is the application's: the operation only takes from them and gives
// back.
package payout
