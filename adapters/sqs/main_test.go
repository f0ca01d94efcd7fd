package sqs

import (
	"testing"

	"github.com/ackwise/ackwise/adapters/sqs/sqstest"
)

// testEndpoint is the endpoint the tests talk to: the emulator sqstest
// starts, or ACKWISE_SQS_ENDPOINT; "" under -short and in a fuzz run,
// where the tests that need SQS skip.
var testEndpoint string

func TestMain(m *testing.M) { sqstest.Main(m, &testEndpoint) }

// needSQS skips t under -short (and in a fuzz run) and returns the
// endpoint.
func needSQS(t testing.TB) string {
	t.Helper()
	if testEndpoint == "" {
		t.Skip("needs the SQS emulator (not under -short, nor in a fuzz run)")
	}
	return testEndpoint
}
