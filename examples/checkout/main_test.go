package main

import "testing"

// The example's promise, as a test: crashes between the charge and the ack
// lose nothing, the inbox makes every redelivery a no-op, and only the poison
// orders are dead-lettered.
func TestCheckoutLosesNothingAndChargesOnce(t *testing.T) {
	sum, err := run(300, 4, 25, true, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(sum)
	if sum.lost != 0 || sum.duplicates != 0 || sum.deadLettered != 4 || sum.effects != 296 || sum.crashes == 0 {
		t.Fatalf("%v: want lost=0 duplicates=0 dead_lettered=4 effects=296 and some crashes", sum)
	}
}

// Without the inbox the same crashes charge some orders twice: the broker
// delivers at least once, and nothing else absorbs the repeats.
func TestCheckoutWithoutInboxDuplicates(t *testing.T) {
	sum, err := run(300, 4, 25, false, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(sum)
	if sum.lost != 0 || sum.duplicates == 0 {
		t.Fatalf("%v: want lost=0 and duplicates above 0", sum)
	}
}

func TestCheckoutRejectsBadFlags(t *testing.T) {
	if _, err := run(0, 0, 1, true, false); err == nil {
		t.Fatal("orders=0 accepted")
	}
}
