// Package meminbox is an in-memory [middleware.InboxStore] and
// [middleware.VersionStore], for tests and examples.
//
// It has the semantics of the database stores — a second claim on a key
// waits until the first commits or rolls back — but no transaction: the
// handler's effects are not rolled back with a claim, and everything is lost
// when the process ends. Do not use it to deduplicate real effects.
package meminbox
