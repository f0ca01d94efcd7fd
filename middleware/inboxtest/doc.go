// Package inboxtest is the conformance suite of [middleware.InboxStore] and
// [middleware.VersionStore] implementations: every store in this module runs
// it against its real backend, and a third-party store can too.
//
// The suite drives the stores through middleware.Inbox and
// middleware.VersionGate, calling the wrapped handler directly as the engine
// would, and redelivering a message by calling it again. [RunBatch] drives a
// [middleware.BatchInboxStore] through middleware.BatchInbox. [RunEngine]
// drives an inbox under the consumer engine on the memory broker with its
// faults.
package inboxtest
