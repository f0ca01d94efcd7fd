package memorytest

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/retry"
)

// SimMode is the kind of broker a [Simulation] plays.
type SimMode int

const (
	// SimQueue plays a work queue (SQS, RabbitMQ): each delivery is leased,
	// a message not acked comes back when its lease runs out, a failed one
	// after the retry policy's delay (a Nack), in any order the broker could
	// produce; with KeyOrdered, one message per key at a time in publish
	// order (an SQS FIFO group).
	SimQueue SimMode = iota
	// SimLog plays a partitioned log (Kafka): records of a partition in
	// offset order, a failed record retried in place (its partition waits),
	// the committed offset advanced after each settle, and a crash or a
	// rebalance re-reading a partition from its committed offset.
	SimLog
)

func (m SimMode) String() string {
	switch m {
	case SimQueue:
		return "queue"
	case SimLog:
		return "log"
	}
	return fmt.Sprintf("SimMode(%d)", int(m))
}

// SimFaultKind names a fault a [Simulation] injects.
type SimFaultKind int

// The fault kinds. Each fires, with its FaultRates probability, at one
// delivery of one message (and, for PublishFailure, LostReply and
// CrashInHandler, at one call the handler makes during that delivery).
const (
	// SimCrashBeforeAck: the handler returned, its effects are done, and
	// the process dies before the settle (ack, nack, dead letter) reaches
	// the broker. The handler's memory and timers are lost; Setup builds a
	// new handler after Simulation.RestartDelay. A queue redelivers the
	// message when its lease runs out; a log re-reads from the committed
	// offset.
	SimCrashBeforeAck SimFaultKind = iota + 1
	// SimCrashAfterAck: the settle reached the broker, then the process
	// dies (in-memory state and timers lost, as above).
	SimCrashAfterAck
	// SimLoseAck: the ack is lost on its way. A queue redelivers the
	// message when its lease runs out; on a log the offset commit is lost
	// (a later commit covers it, unless a crash or rebalance comes first).
	SimLoseAck
	// SimDuplicate: the broker delivers the message a second time. On a
	// queue the second delivery carries the same receipt, and whichever is
	// settled first wins; on a log the record is read once more after its
	// settle, and that read's settle does not move the offset.
	SimDuplicate
	// SimReorder (queue): a message going back to the queue (a
	// redelivery after a lost ack, a crash or a failure) loses its place:
	// newer messages of its key go first, even with KeyOrdered (as a
	// standard queue, a retry topic or a retry through the broker allow).
	SimReorder
	// SimRebalance (log): after the settle, the message's partition is
	// revoked and assigned again: it is re-read from the committed offset
	// (the handler keeps its memory; retries waiting in place are dropped).
	SimRebalance
	// SimPublishFailure: a SimEnv.Publish call fails with
	// ErrSimPublishFailed, either before the messages are stored or after
	// (a lost confirmation: stored, yet reported failed).
	SimPublishFailure
	// SimOutage: from this delivery on, for a drawn window of up to
	// Simulation.MaxOutage of virtual time, SimEnv.Call returns
	// ErrSimOutage without calling the dependency.
	SimOutage
	// SimLostReply: a SimEnv.Call runs the dependency, then returns
	// ErrSimLostReply, as a timeout after the dependency did the work.
	SimLostReply
	// SimCrashInHandler: the process dies inside the handler, right after
	// a SimEnv.Call or Publish did its work: the sim unwinds the handler
	// with a panic (so an inbox rolls its claim back, as a database
	// connection that died would) and treats the process as dead even if
	// the handler recovers. Effects the handler made outside a transaction
	// stay.
	SimCrashInHandler

	numFaultKinds = int(SimCrashInHandler) + 1
)

var faultKindNames = [...]string{"", "crash-before-ack", "crash-after-ack", "lose-ack", "duplicate", "reorder", "rebalance", "publish-failure", "outage", "lost-reply", "crash-in-handler"}

func (k SimFaultKind) String() string {
	if k > 0 && int(k) < len(faultKindNames) {
		return faultKindNames[k]
	}
	return fmt.Sprintf("SimFaultKind(%d)", int(k))
}

// FaultRates are the probabilities, each in [0, 1], that a fault of a kind
// fires at a delivery (SimReorder: at a message's return to the queue;
// SimPublishFailure, SimLostReply and SimCrashInHandler: at a call). A zero FaultRates
// means [DefaultFaultRates]; otherwise a zero field turns its kind off,
// and Off turns every kind off (the workload alone, to test the rules).
//
// Each seed also turns each kind on or off with even odds ("swarm
// testing"): a seed with fewer kinds reaches deeper into the ones it has,
// and the shrunk schedule of a failure names only kinds that matter.
type FaultRates struct {
	CrashBeforeAck float64
	CrashAfterAck  float64
	LoseAck        float64
	Duplicate      float64
	Reorder        float64
	Rebalance      float64
	PublishFailure float64
	Outage         float64
	LostReply      float64
	CrashInHandler float64
	// Off runs no fault at all, whatever the rates.
	Off bool
}

// DefaultFaultRates are the rates of a zero FaultRates.
var DefaultFaultRates = FaultRates{
	CrashBeforeAck: 0.03,
	CrashAfterAck:  0.03,
	LoseAck:        0.03,
	Duplicate:      0.05,
	Reorder:        0.3,
	Rebalance:      0.03,
	PublishFailure: 0.05,
	Outage:         0.02,
	LostReply:      0.03,
	CrashInHandler: 0.02,
}

func (f FaultRates) rates() [numFaultKinds]float64 {
	if f.Off {
		return [numFaultKinds]float64{}
	}
	return [numFaultKinds]float64{0, f.CrashBeforeAck, f.CrashAfterAck, f.LoseAck, f.Duplicate, f.Reorder, f.Rebalance, f.PublishFailure, f.Outage, f.LostReply, f.CrashInHandler}
}

// Defaults of zero Simulation fields.
const (
	DefaultSimSeeds        = 100
	DefaultSimPartitions   = 4
	DefaultSimLease        = 30 * time.Second
	DefaultSimRestartDelay = time.Second
	DefaultSimMaxOutage    = 10 * time.Second
)

// EnvSimulateSeeds names the environment variable that, like the
// -simulate.seeds flag, sets the number of seeds every Simulate call runs
// (the flag wins when both are set).
const EnvSimulateSeeds = "ACKWISE_SIMULATE_SEEDS"

var (
	flagSeeds = flag.Int("simulate.seeds", 0, "memorytest.Simulate: seeds to run per simulation (0: Simulation.Seeds, or $"+EnvSimulateSeeds+")")
	flagSeed  = flag.Uint64("simulate.seed", 0, "memorytest.Simulate: run only this seed (0: all)")
)

// Simulation describes a deterministic simulation of a consumer under
// combined faults: see [Simulate]. S is the type of the user's durable
// state (a database, an inbox store, a ledger): what survives a crash.
type Simulation[S any] struct {
	// Workload is the messages published before the consumer starts, in
	// publish order. Give each one an ID (the event ID) and, for ordering,
	// a Key. Generate, when set, replaces it with a workload drawn per seed.
	Workload []*ackwise.Message
	// Generate returns the workload of one seed from a source seeded by it.
	Generate func(r *rand.Rand) []*ackwise.Message
	// Init returns the durable state of one seed: stores the user's
	// handler writes to (meminbox.New(env.Clock()), an SQLite file in
	// t.TempDir()). It is called once per seed, before the first Setup;
	// nil means the zero S.
	Init func(env *SimEnv) S
	// Setup builds the handler, middleware included (the inbox, a version
	// gate), from the durable state, as the user's main does. It is called
	// at the start and again after each crash: whatever the handler keeps
	// only in memory is lost, as in a real restart. Required.
	Setup func(env *SimEnv, state S) ackwise.Handler
	// Check is the invariant, called once per seed after every message was
	// settled: nil when it holds ("each order charged once", "balances
	// equal the sum of the events"). Required.
	Check func(env *SimEnv, state S) error

	// Seeds is the number of seeds, 1 to Seeds. Default DefaultSimSeeds;
	// the -simulate.seeds flag and $ACKWISE_SIMULATE_SEEDS override it.
	Seeds int
	// Workers is the most handler calls running at once. Default 1: each
	// seed's timeline is then exactly reproducible. With more, calls the
	// schedule allows to overlap run in goroutines; the fault schedule is
	// still the seed's, but what the handlers do in between is up to the
	// Go scheduler (a failure states how often it reproduced).
	Workers int
	// Mode is the broker: SimQueue (the default) or SimLog.
	Mode SimMode
	// KeyOrdered handles the messages of one key one at a time in publish
	// order (queue: a FIFO group; log: records of a key are always in
	// order within their partition, and it changes nothing).
	KeyOrdered bool
	// Partitions is the log's partition count. Default DefaultSimPartitions.
	// Keys map to partitions as with Kafka's default partitioner.
	Partitions int
	// Lease is a queue delivery's visibility timeout: how long a message
	// whose ack was lost, or whose consumer crashed, waits before it is
	// delivered again. Default DefaultSimLease.
	Lease time.Duration
	// Faults are the fault probabilities. Zero means DefaultFaultRates.
	Faults FaultRates
	// Retry is the retry policy applied to a failed handler, as
	// consumer.Config.Retry: attempts, then backoff (jitter drawn from the
	// seed). The zero value means the retry package's defaults.
	Retry retry.Policy
	// Classifiers classify handler errors after the class marks, as
	// consumer.Config.Classifiers. A panic is permanent, as in the engine.
	Classifiers []ackwise.Classifier
	// RestartDelay is how long a crashed process stays down. Default
	// DefaultSimRestartDelay.
	RestartDelay time.Duration
	// MaxOutage bounds a dependency outage window. Default
	// DefaultSimMaxOutage.
	MaxOutage time.Duration
	// MaxDeliveries bounds the deliveries of one seed; a seed that needs
	// more fails as not finishing (a message retried forever). Default 50
	// per message plus 1,000.
	MaxDeliveries int
}

func (s Simulation[S]) withDefaults() Simulation[S] {
	if s.Seeds <= 0 {
		s.Seeds = DefaultSimSeeds
	}
	if s.Workers <= 0 {
		s.Workers = 1
	}
	if s.Partitions <= 0 {
		s.Partitions = DefaultSimPartitions
	}
	if s.Lease <= 0 {
		s.Lease = DefaultSimLease
	}
	if s.Faults == (FaultRates{}) {
		s.Faults = DefaultFaultRates
	}
	if s.RestartDelay <= 0 {
		s.RestartDelay = DefaultSimRestartDelay
	}
	if s.MaxOutage <= 0 {
		s.MaxOutage = DefaultSimMaxOutage
	}
	return s
}

func (s Simulation[S]) validate() error {
	switch {
	case s.Setup == nil:
		return errors.New("memorytest: Simulation.Setup is nil")
	case s.Check == nil:
		return errors.New("memorytest: Simulation.Check is nil")
	case s.Workload == nil && s.Generate == nil:
		return errors.New("memorytest: Simulation has neither Workload nor Generate")
	case s.Mode != SimQueue && s.Mode != SimLog:
		return fmt.Errorf("memorytest: Simulation.Mode = %d: unknown mode", int(s.Mode))
	}
	for i, r := range s.Faults.rates() {
		if !(r >= 0 && r <= 1) {
			return fmt.Errorf("memorytest: FaultRates.%s = %v: must be in [0, 1]", SimFaultKind(i), r)
		}
	}
	return s.Retry.Validate()
}

// SimFault is one fault of a seed's schedule.
type SimFault struct {
	Kind SimFaultKind
	// At is the virtual time it fired, since the start.
	At time.Duration
	// Msg and Key name the message; Index is its place in the workload.
	Msg   string
	Key   string
	Index int
	// Delivery is the message's delivery it fired at (1 is the first;
	// duplicates count).
	Delivery int
	// Call is, for SimPublishFailure and SimLostReply, the handler's
	// call it fired at during that delivery (1 is the first).
	Call int
	// Outage is the length of a SimOutage window.
	Outage time.Duration
	// Stored tells, for SimPublishFailure, that the messages were stored
	// before the failure (a lost confirmation).
	Stored bool
}

func (f SimFault) label() faultLabel {
	return faultLabel{kind: f.Kind, idx: f.Index, delivery: f.Delivery, call: f.Call}
}

func (f SimFault) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s on %s", f.Kind, f.Msg)
	if f.Key != "" {
		fmt.Fprintf(&sb, " (key %s)", f.Key)
	}
	fmt.Fprintf(&sb, ", delivery %d", f.Delivery)
	if f.Call > 0 {
		fmt.Fprintf(&sb, ", call %d", f.Call)
	}
	switch {
	case f.Kind == SimOutage:
		fmt.Fprintf(&sb, ", down for %v", f.Outage)
	case f.Kind == SimPublishFailure && f.Stored:
		sb.WriteString(", after storing (lost confirmation)")
	}
	fmt.Fprintf(&sb, ", at %s", fmtAt(f.At))
	return sb.String()
}

// SimEvent is one line of a seed's timeline.
type SimEvent struct {
	// At is the virtual time since the start.
	At time.Duration
	// Process is the consumer process: 1, then one more after each crash.
	Process int
	// Msg and Key name the message ("" for a process event); Delivery and
	// Attempt are those of the delivery concerned.
	Msg      string
	Key      string
	Delivery int
	Attempt  int
	// What happened: delivered, handled, acked, nacked, dead-lettered,
	// crash, restart, … and the fault names.
	What   string
	Detail string
}

func (e SimEvent) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%10s  p%d  ", fmtAt(e.At), e.Process)
	if e.Msg != "" {
		m := e.Msg
		if e.Key != "" {
			m += " [" + e.Key + "]"
		}
		fmt.Fprintf(&sb, "%-14s ", m)
		if e.Delivery > 0 {
			fmt.Fprintf(&sb, "d%d a%d  ", e.Delivery, e.Attempt)
		}
	}
	sb.WriteString(e.What)
	if e.Detail != "" {
		sb.WriteString(": ")
		sb.WriteString(e.Detail)
	}
	return sb.String()
}

func fmtAt(d time.Duration) string {
	return "+" + strconv.FormatFloat(d.Seconds(), 'f', 3, 64) + "s"
}

// SimTrace is the run of one seed.
type SimTrace struct {
	Seed uint64
	// Faults are the faults that fired, in order.
	Faults []SimFault
	// Events is the timeline.
	Events []SimEvent
	// Violation is Check's error, or the seed's failure to finish; nil
	// when the seed passed.
	Violation error
	// Deliveries counts the handler calls.
	Deliveries int
}

// Timeline renders the events, one a line.
func (tr SimTrace) Timeline() string {
	var sb strings.Builder
	for _, e := range tr.Events {
		sb.WriteString(e.String())
		sb.WriteByte('\n')
	}
	return sb.String()
}

// Trace runs one seed and returns its trace. It returns an error for an
// invalid Simulation. With one worker, the same seed always gives the same
// trace.
func (s Simulation[S]) Trace(seed uint64) (SimTrace, error) {
	s = s.withDefaults()
	if err := s.validate(); err != nil {
		return SimTrace{}, err
	}
	return s.run(seed, nil), nil
}

// run runs one seed; with forced set, exactly the faults it holds may fire.
func (s Simulation[S]) run(seed uint64, forced map[faultLabel]SimFault) SimTrace {
	c := newCore(s.coreConfig(), seed, forced)
	env := &SimEnv{c: c}
	c.env = env
	var workload []*ackwise.Message
	if s.Generate != nil {
		workload = s.Generate(rand.New(rand.NewPCG(seed, 0x5eed)))
	} else {
		workload = s.Workload
	}
	c.load(workload)
	var state S
	if s.Init != nil {
		state = s.Init(env)
	}
	c.setup = func() ackwise.Handler { return s.Setup(env, state) }
	if err := c.loop(); err != nil {
		return c.trace(err)
	}
	return c.trace(s.Check(env, state))
}

func (s Simulation[S]) coreConfig() coreConfig {
	return coreConfig{
		mode:          s.Mode,
		workers:       s.Workers,
		keyOrdered:    s.KeyOrdered,
		partitions:    s.Partitions,
		lease:         s.Lease,
		rates:         s.Faults.rates(),
		retry:         s.Retry,
		classifiers:   s.Classifiers,
		restartDelay:  s.RestartDelay,
		maxOutage:     s.MaxOutage,
		maxDeliveries: s.MaxDeliveries,
	}
}

// Simulate runs sim for seeds 1 to sim.Seeds (or the one seed of
// -simulate.seed) and fails t at the first seed whose Check fails.
//
// Each seed plays the broker of sim.Mode in a single-threaded
// discrete-event loop on a virtual clock: it delivers the workload in an
// order the broker could produce, calls the handler Setup built, settles
// each message by the handler's error as the engine would (classified by
// ackwise.Classify with sim.Classifiers; a transient failure retried
// after sim.Retry's delay until its attempts run out, then
// dead-lettered), and injects faults drawn from the seed: see SimFaultKind.
// No goroutine, wall clock or map order decides anything, so a seed run
// with one worker gives the same timeline every time.
//
// On a failure it shrinks the seed's fault schedule: it replays the seed
// with faults taken away, halves then one at a time (delta debugging),
// keeping each removal after which the check still fails, and reports the
// seed, how to replay it, the shrunk schedule and that schedule's
// timeline.
func Simulate[S any](t testing.TB, sim Simulation[S]) {
	t.Helper()
	sim = sim.withDefaults()
	if err := sim.validate(); err != nil {
		t.Fatal(err)
	}
	seeds := sim.Seeds
	if v := os.Getenv(EnvSimulateSeeds); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("memorytest: $%s = %q: want a positive number of seeds", EnvSimulateSeeds, v)
		}
		seeds = n
	}
	if *flagSeeds > 0 {
		seeds = *flagSeeds
	}
	first, last := uint64(1), uint64(seeds)
	if *flagSeed != 0 {
		first, last = *flagSeed, *flagSeed
	}
	var fired [numFaultKinds]int
	deliveries := 0
	for seed := first; seed <= last; seed++ {
		tr := sim.run(seed, nil)
		deliveries += tr.Deliveries
		for _, f := range tr.Faults {
			fired[f.Kind]++
		}
		if tr.Violation != nil {
			t.Fatal(sim.report(t, tr))
		}
	}
	var sb strings.Builder
	for k := 1; k < numFaultKinds; k++ {
		if fired[k] > 0 {
			fmt.Fprintf(&sb, " %s %d,", SimFaultKind(k), fired[k])
		}
	}
	t.Logf("memorytest.Simulate: %d seeds passed (%s mode, workers %d), %d deliveries; faults fired:%s", last-first+1, sim.Mode, sim.Workers, deliveries, strings.TrimSuffix(sb.String(), ","))
}

// maxShrinkRuns bounds the replays a shrink makes.
const maxShrinkRuns = 2000

// reproRuns is how many times a failure with several workers is replayed
// to state how often it reproduces.
const reproRuns = 10

// fails replays seed with exactly the faults of schedule and returns the
// trace when the check still fails. With several workers it tries up to 3
// times: a run's outcome depends on the Go scheduler too.
func (s Simulation[S]) fails(seed uint64, schedule []SimFault) (SimTrace, bool) {
	forced := make(map[faultLabel]SimFault, len(schedule))
	for _, f := range schedule {
		forced[f.label()] = f
	}
	tries := 1
	if s.Workers > 1 {
		tries = 3
	}
	for range tries {
		if tr := s.run(seed, forced); tr.Violation != nil {
			return tr, true
		}
	}
	return SimTrace{}, false
}

// shrink returns the smallest failing schedule it finds within
// maxShrinkRuns replays, the trace of its run, and the replays made.
func (s Simulation[S]) shrink(tr SimTrace) (SimTrace, int) {
	best := tr
	runs := 0
	try := func(cand []SimFault) bool {
		if runs >= maxShrinkRuns {
			return false
		}
		runs++
		got, ok := s.fails(tr.Seed, cand)
		if ok {
			best = got // its fired faults: those of cand it reached
		}
		return ok
	}
	// The full schedule replayed must fail too (it does with one worker:
	// forcing the faults that fired gives the same run).
	if !try(tr.Faults) {
		return tr, runs
	}
	for n := len(best.Faults) / 2; n >= 1; n /= 2 {
		for i := 0; i+n <= len(best.Faults); {
			cur := best.Faults
			cand := append(append([]SimFault(nil), cur[:i]...), cur[i+n:]...)
			if !try(cand) {
				i += n
			}
		}
	}
	// One at a time until none can go. A fault that made its message be
	// delivered again (a lost ack, a failure) numbers the later faults of
	// that message by deliveries it caused: removing it, try those one
	// delivery earlier too.
	for changed := true; changed; {
		changed = false
		for i := 0; i < len(best.Faults); i++ {
			cur := best.Faults
			cand := append(append([]SimFault(nil), cur[:i]...), cur[i+1:]...)
			if try(cand) {
				changed = true
				i--
				continue
			}
			if shifted, ok := shiftDeliveries(cand, cur[i]); ok && try(shifted) {
				changed = true
				i--
			}
		}
	}
	return best, runs
}

// maxTimelineLines is how long a printed timeline gets before lines about
// messages no fault touched are left out.
const maxTimelineLines = 60

func (s Simulation[S]) report(t testing.TB, tr SimTrace) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "memorytest.Simulate: seed %d (%s mode, workers %d, %d deliveries) fails the check: %v\n", tr.Seed, s.Mode, s.Workers, tr.Deliveries, tr.Violation)
	fmt.Fprintf(&sb, "replay it: go test -run '%s' -simulate.seed=%d\n", runPattern(t.Name()), tr.Seed)
	if s.Workers > 1 {
		n := 0
		for range reproRuns {
			if s.run(tr.Seed, nil).Violation != nil {
				n++
			}
		}
		fmt.Fprintf(&sb, "with %d workers the seed's fault schedule is fixed but handler interleaving is not: it failed again in %d of %d replays\n", s.Workers, n, reproRuns)
	}
	fmt.Fprintf(&sb, "faults drawn (%d):\n", len(tr.Faults))
	writeFaults(&sb, tr.Faults)
	shrunk, runs := s.shrink(tr)
	fmt.Fprintf(&sb, "shrunk in %d replays to %d fault(s), still failing: %v\n", runs, len(shrunk.Faults), shrunk.Violation)
	writeFaults(&sb, shrunk.Faults)
	sb.WriteString("timeline of the shrunk schedule (virtual time, process, message [key], delivery and attempt, event):\n")
	writeTimeline(&sb, shrunk)
	return sb.String()
}

func writeFaults(sb *strings.Builder, faults []SimFault) {
	for i, f := range faults {
		fmt.Fprintf(sb, "  %d. %s\n", i+1, f)
	}
}

func writeTimeline(sb *strings.Builder, tr SimTrace) {
	keep := func(SimEvent) bool { return true }
	if len(tr.Events) > maxTimelineLines {
		touched := map[string]bool{}
		for _, f := range tr.Faults {
			touched[f.Msg] = true
			if f.Key != "" {
				touched["key:"+f.Key] = true
			}
		}
		keep = func(e SimEvent) bool {
			return e.Msg == "" || touched[e.Msg] || (e.Key != "" && touched["key:"+e.Key]) || e.What == "check"
		}
	}
	left := 0
	for _, e := range tr.Events {
		if !keep(e) {
			left++
			continue
		}
		sb.WriteString("  ")
		sb.WriteString(e.String())
		sb.WriteByte('\n')
	}
	if left > 0 {
		fmt.Fprintf(sb, "  (%d events of messages and keys no fault touched left out; SimTrace.Timeline from Simulation.Trace(%d) has them all)\n", left, tr.Seed)
	}
}

// runPattern returns a -run pattern matching exactly the test named name.
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// shiftDeliveries returns faults with those of removed's message at later
// deliveries moved one delivery earlier, and whether there were any.
func shiftDeliveries(faults []SimFault, removed SimFault) ([]SimFault, bool) {
	out := append([]SimFault(nil), faults...)
	moved := false
	for i := range out {
		if out[i].Index == removed.Index && out[i].Delivery > removed.Delivery {
			out[i].Delivery--
			moved = true
		}
	}
	return out, moved
}
