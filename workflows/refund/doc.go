// Package refund is the demo's business: orders that customers paid, refunds of
// them through a payment provider, and the double-entry ledger that both move
// money in. It defines two operations for the engine, reads for the demo's GET
// endpoints, and the tables they use (see Migrate).
//
// Every object belongs to a client (the API caller on whose behalf it was made):
// the operations take the client in their input, and every read is scoped by it,
// so that one client never sees another's orders, refunds or accounts.
//
// # Operations
//
// New returns the operation types; give Workflows.Operations to engine.Config.
//
// The order operation (OrderOperation) records an order in one transactional step,
// "record": it fails with CodeOrderExists when the client has an order of that id,
// and moves the order's amount from the customer's account to the merchant's.
//
// The refund operation (RefundOperation) refunds part or all of an order. Its
// version 1 (RefundV1) has three steps:
//
//  1. "ledger" (transactional): in one statement, takes the amount from what is
//     left to refund of the order (the order's refunded column, which an UPDATE
//     raises only while it stays at most the order's amount, so that two refunds
//     of one order check one after the other), records the refund as pending, and
//     moves the amount from the merchant to the customer. When the order does
//     not exist, or has less than the amount left, the statement itself fails
//     the operation (idemflow_fail) with CodeOrderNotFound or
//     CodeAmountExceedsRefundable. The step never reads the statement's result,
//     so it goes with the step's checkpoint and COMMIT (engine.AtCommit): one
//     round trip, the key's reservation included. If a later step fails for
//     good, its compensation, also one statement, marks the refund failed, moves
//     the amount back and gives it back to what is left to refund.
//  2. "provider" (external): asks the Provider for the refund under the step's
//     derived idempotency key. A decline fails the operation with
//     CodeProviderDeclined; any other error is retried with the same key, and a
//     retry first asks the provider, by that key, whether the lost attempt went
//     through.
//  3. "finalize" (transactional): marks the refund succeeded with the provider's
//     refund id, in one statement sent with the checkpoint and COMMIT too.
//
// Version 2 (RefundV2) adds a fourth step, "receipt", which gives the succeeded
// refund a receipt number. Version 3 (RefundV3) has a step "approval" between
// "ledger" and "provider" too (see Approvals).
//
// # Approvals
//
// The approval step of version 3 is an engine.ApprovalStep: a refund of at
// least Config.ApprovalThreshold waits there, after its ledger step reserved
// the amount, until Config.Approvals distinct operators approved it
// (engine.Engine.Approve), with no process busy on it; a smaller one passes
// it at once. The number of approvals and the moment the wait expires
// (Config.ApprovalTimeout after the step is reached) are fixed and stored
// when the refund reaches the step. A rejection (engine.Engine.Reject) fails
// the refund with CodeRefundRejected, and an expiry with CodeApprovalExpired:
// business failures, after which the ledger's compensation reverses its move
// and the provider is never asked. ListApprovals lists the refunds that wait,
// with their client, order and amount, read from the refund's row, which
// records the operation that made it.
//
// # Webhooks
//
// The provider tells of every refund it makes with a webhook event, delivered
// at least once, and often before the refund's finalize step has recorded the
// provider's id: its answer and its event leave the provider together. The
// demo's endpoint is entry/webhook's Outcomes: EventOutcome is what it keeps
// in the engine's inbox under the refund's derived key, and
// RecordProviderEvent its TxFunc, in the same transaction: it records the
// event (demo_provider_event, once per id, with a digest of each top-level
// field of its body, so that an id that comes again with another body is
// refused, under whatever key) and confirms the refund with that provider
// refund id. (The provider event operation, ProviderEventOperation, which
// applied events before, stays registered only so that one started before
// still finishes.) The event and the refund meet in one row per provider
// refund id (demo_refund_confirmation), which the event's record and the
// refund's finalize step each write their half of with INSERT ... ON CONFLICT
// DO UPDATE: the second writer waits for the first one's commit and then sees
// its half, so the one that comes second confirms the refund, once, whichever
// it is and however they race. An event for a refund that is not finalized yet (or never will be
// here) is kept until it is. GetRefund says whether the refund is confirmed.
//
// # Queue
//
// Orders may also arrive as queued messages: EnqueueOrder records a message
// and inserts its River job (QueueOrderArgs) in the caller's transaction, and
// OrderConsumer configures entry/riverjob's worker, which starts the order
// operation keyed by the message's id in the client's QueueScope, in the
// transaction that completes the job, and counts the delivery in the
// message's record (GetQueueMessage) in that transaction too. A delivery again
// finds the operation; one with another body is rejected.
//
// # Settlements
//
// The settlement operation (SettlementOperation) moves a client's whole
// merchant balance to the account PayoutAccount(slot), where the slot is the
// start of the settlement's period, keyed by entry/schedule's slot key in the
// client's scope, in one transactional step, "settle": after an advisory lock
// that serialises the client's settlements, one statement reads the
// merchant's balance, records the settlement (demo_settlement, unique per
// client and slot, so that a slot run again after the engine's retention
// deleted its operation fails with CodeSettlementExists instead of paying
// twice) and moves the balance. A balance that is not positive settles 0.
// ListSettlements reads a client's settlements.
//
// # Ledger
//
// Every move of money is two ledger entries, written by one statement, whose
// amounts sum to zero: the account paid from goes down, the account paid to goes
// up. A client's accounts are "merchant", "customer:<customerId>" for each of
// its customers and "payout:<slot>" for each settlement, so a client's balances
// always sum to zero, and its merchant balance equals its orders less its
// refunds that are pending or succeeded, less what settlements paid out.
//
// # Provider
//
// The provider step calls a Provider. ProviderClient is one over HTTP, for a
// provider that speaks the API of the demo's fake provider (Stripe's style: an
// Idempotency-Key header, 402 for a decline).
package refund
