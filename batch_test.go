package ackwise_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
)

func TestBatchOutcomes(t *testing.T) {
	boom := errors.New("boom")
	per := ackwise.NewBatchError(3)
	per.Set(1, ackwise.Permanent(boom))
	for _, tc := range []struct {
		name string
		err  error
		want []string
	}{
		{"nil", nil, []string{"", "", ""}},
		{"one for all", boom, []string{"boom", "boom", "boom"}},
		{"per message", per, []string{"", "boom", ""}},
		{"per message wrapped", fmt.Errorf("db: %w", per), []string{"", "boom", ""}},
		{"wrong length", &ackwise.BatchError{Errs: []error{nil}}, []string{"length", "length", "length"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := []error{boom, boom, boom} // stale entries must be overwritten
			ackwise.BatchOutcomes(tc.err, errs)
			for i, w := range tc.want {
				switch {
				case w == "" && errs[i] != nil:
					t.Errorf("errs[%d] = %v, want nil", i, errs[i])
				case w != "" && (errs[i] == nil || !strings.Contains(errs[i].Error(), w)):
					t.Errorf("errs[%d] = %v, want one containing %q", i, errs[i], w)
				}
			}
			if tc.name == "wrong length" && !errors.Is(errs[0], ackwise.ErrBatchLength) {
				t.Errorf("errs[0] = %v, want ErrBatchLength", errs[0])
			}
		})
	}
}

func TestBatchErrorClassAndText(t *testing.T) {
	e := ackwise.NewBatchError(5)
	if e.Err() != nil {
		t.Fatalf("Err of an all-nil BatchError = %v, want nil", e.Err())
	}
	e.Set(0, ackwise.RetryAfter(errors.New("slow down"), time.Second))
	e.Set(2, ackwise.Permanent(errors.New("bad row")))
	for i := 3; i < 5; i++ {
		e.Set(i, errors.New("x"))
	}
	if e.Err() == nil {
		t.Fatal("Err = nil with entries set")
	}
	if got := ackwise.ClassOf(e); got != ackwise.ClassRateLimited {
		t.Errorf("ClassOf = %v, want the first marked failure's class (rate-limited)", got)
	}
	if s := e.Error(); !strings.HasPrefix(s, "4 of 5 message(s)") || !strings.Contains(s, "and 1 more") {
		t.Errorf("Error() = %q", s)
	}
}

func TestChainBatch(t *testing.T) {
	var order []string
	mw := func(name string) ackwise.BatchMiddleware {
		return func(next ackwise.BatchHandler) ackwise.BatchHandler {
			return ackwise.BatchHandlerFunc(func(ctx context.Context, msgs []*ackwise.Message) error {
				order = append(order, name)
				return next.HandleBatch(ctx, msgs)
			})
		}
	}
	h := ackwise.ChainBatch(ackwise.BatchHandlerFunc(func(context.Context, []*ackwise.Message) error {
		order = append(order, "h")
		return nil
	}), mw("a"), nil, mw("b"))
	if err := h.HandleBatch(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(order, ","); got != "a,b,h" {
		t.Errorf("order = %s, want a,b,h", got)
	}
}
