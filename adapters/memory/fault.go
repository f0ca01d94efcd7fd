package memory

import (
	"errors"
	"fmt"
	"sync"

	"github.com/ackwise/ackwise"
)

// Sentinel errors. Injected failures wrap them, so errors.Is finds them.
var (
	// ErrCrashed is returned by the settle call an injected crash fired on,
	// and by every later call on the crashed source.
	ErrCrashed = errors.New("memory: consumer crashed (injected)")
	// ErrUnavailable is returned by every broker call made during an outage
	// (see Broker.Outage).
	ErrUnavailable = errors.New("memory: broker unavailable (injected outage)")
	// ErrInjected is the default error of FaultFailPublish and FaultFailAck.
	ErrInjected = errors.New("memory: injected failure")
	// ErrNackUnsupported is returned by Nack on a log source, whose
	// Capabilities.Delay is false: the engine retries in place instead.
	ErrNackUnsupported = errors.New("memory: Nack is not supported on a log source (Capabilities.Delay is false)")
	// ErrNotFound is returned for a queue or topic that does not exist.
	ErrNotFound = errors.New("memory: no such queue or topic")
	// ErrConflict is returned when a queue or topic exists with another kind
	// or another configuration than asked for.
	ErrConflict = errors.New("memory: destination exists with another kind or configuration")
)

// FaultKind names an injectable fault.
type FaultKind int

// Fault kinds. Settle faults fire on settle calls, receive faults on Receive,
// publish faults on Publish (including the publish of a dead letter into its
// dead-letter destination).
const (
	// FaultCrashBeforeAck (settle: Ack): the consumer crashes after its
	// handler but before the ack reaches the broker. Ack returns ErrCrashed
	// without settling; the source is crashed from then on (every call returns
	// ErrCrashed, Valid is false). Its unsettled deliveries come back after
	// their lease on a queue; on a log the member leaves its group and the
	// records are re-read from the committed offset.
	FaultCrashBeforeAck FaultKind = iota + 1
	// FaultCrashBeforeSettle is FaultCrashBeforeAck firing on Ack, Nack and
	// DeadLetter alike.
	FaultCrashBeforeSettle
	// FaultLoseAck (settle: Ack): Ack returns nil but is not applied, so the
	// message comes back after its lease (queue) or its offset is never
	// committed (log).
	FaultLoseAck
	// FaultFailAck (settle: Ack): Ack returns Fault.Err (default ErrInjected)
	// and is not applied; the source stays healthy.
	FaultFailAck
	// FaultDuplicate (receive): the message is delivered twice, as two
	// deliveries of the same attempt (the second one in the same batch when
	// buf has room, else later). On a queue the second one comes first in
	// the next Receive, and whichever is settled first wins and the other's
	// settle returns ErrReceiptInvalid. On a log it comes in a later Receive
	// in offset order among its partition's released records, never ahead
	// of a lower one (a real log's duplicates come from rewinds, in offset
	// order), and is dropped when its partition is revoked or reset first.
	FaultDuplicate
	// FaultReorder (receive): a batch of two or more messages is returned in
	// reverse order. Match, when set, must match one message of the batch.
	FaultReorder
	// FaultFailPublish (publish): Publish fails with Fault.Err (default
	// ErrInjected) at the matching message; the messages before it in the
	// batch are stored, and the matching one too when AfterStore is set (a
	// lost confirmation). Sink.Publish reports it per message (see
	// adapters.PublishError).
	FaultFailPublish
	// FaultHangPublish (publish): Publish blocks at the matching message
	// until ctx is done and returns ctx's error, as a broker that stopped
	// answering would. With AfterStore the message was stored first.
	FaultHangPublish
)

var faultNames = [...]string{"", "crash-before-ack", "crash-before-settle", "lose-ack", "fail-ack", "duplicate", "reorder", "fail-publish", "hang-publish"}

// String returns the fault's name as the history and logs show it.
func (k FaultKind) String() string { return nameOf(faultNames[:], int(k), "fault") }

// nameOf returns names[k], or what(k) for a k that has no name.
func nameOf(names []string, k int, what string) string {
	if k > 0 && k < len(names) {
		return names[k]
	}
	return fmt.Sprintf("%s(%d)", what, k)
}

// Fault describes an injected fault. Faults are deterministic: which call a
// fault fires on depends only on the order of calls, never on chance.
type Fault struct {
	// Kind is the fault to inject.
	Kind FaultKind
	// Match, when set, restricts the fault to messages it returns true for.
	// It is called with the destination's lock held and must not call the
	// broker.
	Match func(msg *ackwise.Message) bool
	// Count is how many times the fault fires before it goes quiet; 0 means
	// no limit.
	Count int
	// Every makes the fault fire on every Every-th matching call (the
	// Every-th, the 2·Every-th, …); 0 and 1 mean every matching call.
	Every int
	// Err is the error of FaultFailPublish and FaultFailAck; nil means
	// ErrInjected.
	Err error
	// AfterStore makes FaultFailPublish and FaultHangPublish store the
	// message before failing: the confirmation is what gets lost.
	AfterStore bool
}

func (f Fault) validate(forSource bool) error {
	if f.Kind < FaultCrashBeforeAck || f.Kind > FaultHangPublish {
		return fmt.Errorf("memory: Fault.Kind = %d: unknown fault kind", int(f.Kind))
	}
	if forSource && (f.Kind == FaultFailPublish || f.Kind == FaultHangPublish) {
		return fmt.Errorf("memory: Fault.Kind = %s: a publish fault cannot be injected into a source; inject it into the destination", f.Kind)
	}
	if f.Count < 0 {
		return fmt.Errorf("memory: Fault.Count = %d: must not be negative (0 means unlimited)", f.Count)
	}
	if f.Every < 0 {
		return fmt.Errorf("memory: Fault.Every = %d: must not be negative", f.Every)
	}
	return nil
}

// InjectedFault is a fault in force on a destination or source.
type InjectedFault struct {
	f     Fault
	mu    *sync.Mutex // the destination's lock
	list  *[]*InjectedFault
	seen  int
	fired int
}

// Fired returns how many times the fault fired so far.
func (x *InjectedFault) Fired() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.fired
}

// Remove takes the fault out of force. Removing it twice is harmless.
func (x *InjectedFault) Remove() {
	x.mu.Lock()
	defer x.mu.Unlock()
	l := *x.list
	for i, y := range l {
		if y == x {
			*x.list = append(l[:i:i], l[i+1:]...)
			return
		}
	}
}

// tryFire reports whether x fires for msg now and counts it. Caller holds
// x.mu.
func (x *InjectedFault) tryFire(msg *ackwise.Message) bool {
	if x.f.Count > 0 && x.fired >= x.f.Count {
		return false
	}
	if x.f.Match != nil && !x.f.Match(msg) {
		return false
	}
	x.seen++
	if x.f.Every > 1 && x.seen%x.f.Every != 0 {
		return false
	}
	x.fired++
	return true
}

func (x *InjectedFault) err() error {
	if x.f.Err != nil {
		return x.f.Err
	}
	return ErrInjected
}

// fire returns the first fault among lists of one of kinds that fires for
// msg. Caller holds the destination lock.
func fire(msg *ackwise.Message, lists [2][]*InjectedFault, kinds ...FaultKind) *InjectedFault {
	for _, l := range lists {
		for _, x := range l {
			for _, k := range kinds {
				if x.f.Kind == k && x.tryFire(msg) {
					return x
				}
			}
		}
	}
	return nil
}

func newFault(f Fault, mu *sync.Mutex, list *[]*InjectedFault) *InjectedFault {
	x := &InjectedFault{f: f, mu: mu, list: list}
	*list = append(*list, x)
	return x
}

// fireBatch fires the first reorder fault matching a message of batch.
func fireBatch(batch []*ackwise.Message, lists [2][]*InjectedFault) *InjectedFault {
	for _, l := range lists {
		for _, x := range l {
			if x.f.Kind != FaultReorder || (x.f.Count > 0 && x.fired >= x.f.Count) {
				continue
			}
			m := batch[0]
			if x.f.Match != nil {
				m = nil
				for _, b := range batch {
					if x.f.Match(b) {
						m = b
						break
					}
				}
				if m == nil {
					continue
				}
			}
			f := x.f.Match
			x.f.Match = nil
			ok := x.tryFire(m)
			x.f.Match = f
			if ok {
				return x
			}
		}
	}
	return nil
}
