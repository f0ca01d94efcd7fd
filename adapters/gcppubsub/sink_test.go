package gcppubsub

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

// A publish refused on an ordering key fails each message of the call as a
// PublishError entry saying the key was resumed, and the key is resumed: a
// later publish on it goes through (without ResumePublish the client would
// refuse it with ErrPublishingPaused).
func TestSinkResumesKeyAfterFailure(t *testing.T) {
	t.Parallel()
	f, d := withMessages(t, nil)
	sink := openSink(t, f, d)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f.srv.SetAutoPublishResponse(false)
	f.srv.AddPublishResponse(nil, status.Error(codes.PermissionDenied, "denied"))
	err := sink.Publish(ctx, &ackwise.Message{ID: "a", Key: "k", Payload: []byte("1")})
	pe, ok := errors.AsType[*adapters.PublishError](err)
	if !ok || len(pe.Failed) != 1 || pe.Failed[0].Index != 0 || !strings.Contains(err.Error(), `ordering key "k"`) || !strings.Contains(err.Error(), "resumed") {
		t.Fatalf("Publish: %v, want a PublishError saying key k was resumed", err)
	}
	f.srv.AddPublishResponse(&pubsubpb.PublishResponse{MessageIds: []string{"m-after"}}, nil)
	if err := sink.Publish(ctx, &ackwise.Message{ID: "b", Key: "k", Payload: []byte("2")}); err != nil {
		t.Fatalf("Publish on the key after the failure: %v", err)
	}
}

// The sink sets the event ID attribute from Message.EventID, drops the
// engine's hop headers, and keeps the key as the ordering key.
func TestSinkAttributes(t *testing.T) {
	t.Parallel()
	m := toPubsub(&ackwise.Message{ID: "ev", Key: "k", Payload: []byte("p"), Headers: ackwise.HeadersOf(ackwise.HeaderEventID, "forged", ackwise.HeaderAttempt, "3", "x", "1", "x", "2")})
	if m.Attributes[ackwise.HeaderEventID] != "ev" || m.Attributes["x"] != "2" || m.OrderingKey != "k" || string(m.Data) != "p" {
		t.Fatalf("attributes %v key %q", m.Attributes, m.OrderingKey)
	}
	if _, ok := m.Attributes[ackwise.HeaderAttempt]; ok {
		t.Fatal("hop header published")
	}
	m = toPubsub(&ackwise.Message{Headers: ackwise.HeadersOf(ackwise.HeaderEventID, "from-header")})
	if m.Attributes[ackwise.HeaderEventID] != "from-header" {
		t.Fatalf("event ID from the header: %v", m.Attributes)
	}
}

// Publish after Close fails with ErrClosed.
func TestSinkClosed(t *testing.T) {
	t.Parallel()
	f, d := withMessages(t, nil)
	sink := openSink(t, f, d)
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	if err := sink.Publish(context.Background(), &ackwise.Message{ID: "a"}); !errors.Is(err, adapters.ErrClosed) {
		t.Fatalf("Publish after Close: %v", err)
	}
}
