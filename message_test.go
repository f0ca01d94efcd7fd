package ackwise_test

import (
	"testing"

	"github.com/ackwise/ackwise"
)

func TestMessageEventID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		msg  ackwise.Message
		want string
	}{
		{"none", ackwise.Message{}, ""},
		{"ID", ackwise.Message{ID: "ev-1"}, "ev-1"},
		{"header", ackwise.Message{Headers: ackwise.HeadersOf(ackwise.HeaderEventID, "ev-2")}, "ev-2"},
		{"ID over header", ackwise.Message{ID: "ev-1", Headers: ackwise.HeadersOf(ackwise.HeaderEventID, "ev-2")}, "ev-1"},
		{"repeated header: the last", ackwise.Message{Headers: ackwise.Headers{{Key: ackwise.HeaderEventID, Value: "a"}, {Key: ackwise.HeaderEventID, Value: "b"}}}, "b"},
		{"empty header", ackwise.Message{Headers: ackwise.HeadersOf(ackwise.HeaderEventID, "")}, ""},
		{"not trimmed", ackwise.Message{ID: " ev-1 "}, " ev-1 "},
		{"header not trimmed", ackwise.Message{Headers: ackwise.HeadersOf(ackwise.HeaderEventID, " ev-2\n")}, " ev-2\n"},
		{"other headers only", ackwise.Message{Headers: ackwise.HeadersOf("Ackwise-Event-Id", "x", "event-id", "y")}, ""},
	} {
		if got := tc.msg.EventID(); got != tc.want {
			t.Errorf("%s: EventID() = %q, want %q", tc.name, got, tc.want)
		}
	}
}
