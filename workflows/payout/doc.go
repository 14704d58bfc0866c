// Package payout pays money out of a wallet to a bank account through a bank's
// API, as one idemflow operation that survives retries and crashes: the wallet
// is debited once, the bank pays once, and a declined payout gives the money
// back. It is built on idemflow's public API only (engine, steps/httpstep), and
// tested with idemflowtest and its fakeservice: the example to copy for an
// operation of your own.
//
//	op, err := payout.New(payout.Config{BankURL: "https://bank.example/v1"})
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
//  2. "bank" (external, made with httpstep): POSTs the payout to the bank
//     under the step's derived idempotency key, the same on every attempt.
//     This is the pivot, the point of no return: it has no compensation (a
//     bank payout cannot be called back), so once it has succeeded the payout
//     only goes forward.
//  3. "mark_paid" (transactional, after the pivot): records the bank's payout
//     id against the payout row, which becomes paid. It is retried until it
//     succeeds.
//
// The result (Result) is stored with mark_paid's transaction, and a client's
// retry of its key gets it back without anything running again.
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
// the wallet back once.
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
