package kafka

import "testing"

// The attempts a TransactSession counts stay bounded: records of
// partitions lost after an abort are never committed here, so nothing else
// would forget them.
func TestTransactAttemptsBounded(t *testing.T) {
	t.Parallel()
	s := &TransactSession{attempts: map[txnRecord]txnAttempt{}}
	batch := make([]txnRecord, 1000)
	for round := range 200 { // 200 aborted batches of 1,000 records, none committed
		for i := range batch {
			batch[i] = txnRecord{"t", int32(round), int64(i)}
		}
		s.countAttempts(nil, batch, false)
		if len(s.attempts) > maxTxnAttempts+2*len(batch) {
			t.Fatalf("round %d: %d records counted, above %d and a batch", round, len(s.attempts), maxTxnAttempts)
		}
	}
	// The last batch's records are counted.
	if a := s.attempts[txnRecord{"t", 199, 5}]; a.n != 1 {
		t.Fatalf("last aborted record counted %d times, want 1", a.n)
	}
	// A batch larger than the bound is counted too: aborted twice, its
	// records come back at attempt 3.
	big := make([]txnRecord, maxTxnAttempts+10)
	for i := range big {
		big[i] = txnRecord{"big", 0, int64(i)}
	}
	s.countAttempts(nil, big, false)
	s.countAttempts(nil, big, false)
	if a := s.attempts[txnRecord{"big", 0, 7}]; a.n != 2 {
		t.Fatalf("a record of a batch above the bound counted %d times after two aborts, want 2", a.n)
	}
}
