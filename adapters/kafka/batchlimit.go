package kafka

import (
	"context"
	"strconv"
	"sync"
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
	m  atomic.Pointer[map[string]int32]
	mu sync.Mutex // serializes the writers of m

	// client is the batch limit the client applies (the limits read here,
	// unless the Options of the config set kgo.ProducerBatchMaxBytes), set by read.
	client func(topic string) int32
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
// whose limit it cannot read keep the default. franz-go does not follow a
// limit changed later; reread reads one again for the sources' own sizing
// of their moves (see fitDeadLetter).
func (l *batchLimits) read(ctx context.Context, cl *kgo.Client, topics ...string) {
	if fn, ok := cl.OptValue(kgo.ProducerBatchMaxBytesFn).(func(string) int32); ok {
		l.client = fn
	}
	l.store(describeLimits(ctx, cl, topics))
}

// reread reads topic's max.message.bytes again (a record was refused as
// too large: the limit was lowered after read, or read could not read it).
func (l *batchLimits) reread(ctx context.Context, cl *kgo.Client, topic string) {
	l.store(describeLimits(ctx, cl, []string{topic}))
}

// store adds limits to those known.
func (l *batchLimits) store(limits map[string]int32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := make(map[string]int32, len(limits))
	if old := l.m.Load(); old != nil {
		for k, v := range *old {
			m[k] = v
		}
	}
	for k, v := range limits {
		m[k] = v
	}
	l.m.Store(&m)
}

// limit is the most bytes a record batch of topic may have: the
// max.message.bytes read, within the client's own batch limit.
func (l *batchLimits) limit(topic string) int {
	n := defaultBatchMax
	if m := l.m.Load(); m != nil {
		if v, ok := (*m)[topic]; ok {
			n = int(v)
		}
	}
	if l.client != nil {
		n = min(n, int(l.client(topic)))
	}
	return n
}

// describeLimits reads the max.message.bytes of topics (see read).
func describeLimits(ctx context.Context, cl *kgo.Client, topics []string) map[string]int32 {
	rcs, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, topics...)
	if err != nil {
		return nil
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
	return m
}
