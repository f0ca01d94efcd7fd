package kafka

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ackwise/ackwise"
)

// NewTopicName returns a fresh topic name (for the external test package).
func NewTopicName(testing.TB) string { return uniq("conf") }

// ReadTopicForTest reads a topic up to its end as messages.
func ReadTopicForTest(ctx context.Context, t testing.TB, brokers []string, topic string) []*ackwise.Message {
	recs := readAll(ctx, t, brokers, topic)
	out := make([]*ackwise.Message, len(recs))
	for i, r := range recs {
		out[i] = recordMessage(r)
	}
	return out
}

// SetShareLockForTest sets share group group's record lock duration (the
// group config share.record.lock.duration.ms), which a ShareSource opened
// afterwards reports as its lease.
func SetShareLockForTest(ctx context.Context, t testing.TB, brokers []string, group string, d time.Duration) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = group
	rc := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	rc.Name = "share.record.lock.duration.ms"
	v := strconv.FormatInt(d.Milliseconds(), 10)
	rc.Value = &v
	res.Configs = append(res.Configs, rc)
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil || len(resp.Resources) != 1 || resp.Resources[0].ErrorCode != 0 {
		t.Fatalf("alter the lock duration of share group %s: %v %+v", group, err, resp)
	}
}
