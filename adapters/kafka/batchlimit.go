package kafka

import (
	"context"
	"strconv"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// defaultBatchMax is franz-go's default largest record batch, Kafka's
// default max.message.bytes.
const defaultBatchMax = 1000012

// batchLimits makes a client batch the records of each topic it produces to
// under that topic's max.message.bytes: franz-go batches up to
// defaultBatchMax a partition and does not split a batch the broker refuses,
// so records that each fit would be refused with a too-large batch-mate (as
// MESSAGE_TOO_LARGE, for good). The zero value gives every topic the
// default until read has read the limits.
type batchLimits struct {
	m atomic.Pointer[map[string]int32]
}

// opt is the client option that applies the limits. franz-go reads a
// topic's limit when it first produces to a partition of it: after read,
// which the sink and the sources call before they return.
func (l *batchLimits) opt() kgo.Opt {
	return kgo.ProducerBatchMaxBytesFn(func(topic string) int32 {
		if m := l.m.Load(); m != nil {
			if n, ok := (*m)[topic]; ok {
				return n
			}
		}
		return defaultBatchMax
	})
}

// read reads the max.message.bytes of topics, where the broker tells it
// (the topic exists, DescribeConfigs is allowed) and franz-go takes it as a
// batch limit ([512, 1<<30]), never above what cl writes to a broker at once
// (franz-go checks that only for the limit a client is made with). Topics
// whose limit it cannot read keep the default. A limit changed later is not
// followed.
func (l *batchLimits) read(ctx context.Context, cl *kgo.Client, topics ...string) {
	rcs, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, topics...)
	if err != nil {
		return
	}
	w, _ := cl.OptValue(kgo.BrokerMaxWriteBytes).(int32)
	m := make(map[string]int32, len(rcs))
	for _, rc := range rcs {
		if rc.Err != nil {
			continue
		}
		for _, c := range rc.Configs {
			if c.Key != "max.message.bytes" || c.Value == nil {
				continue
			}
			n, err := strconv.ParseInt(*c.Value, 10, 32)
			if err != nil || n < 512 || n > 1<<30 {
				break
			}
			if w > 0 {
				n = min(n, int64(w))
			}
			m[rc.Name] = int32(n)
		}
	}
	l.m.Store(&m)
}
