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
		if len(s.attempts) > maxTxnAttempts {
			t.Fatalf("round %d: %d records counted, above %d", round, len(s.attempts), maxTxnAttempts)
		}
	}
	// The last batch's records are counted.
	if a := s.attempts[txnRecord{"t", 199, 5}]; a.n != 1 {
		t.Fatalf("last aborted record counted %d times, want 1", a.n)
	}
}
