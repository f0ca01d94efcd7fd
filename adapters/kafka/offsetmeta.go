package kafka

import (
	"encoding/base64"
	"encoding/binary"
	"strings"
)

// Commit metadata: like Confluent's Parallel Consumer, a commit carries the
// offsets above the committed one that are already settled, so that the
// next owner of the partition (or this member after a crash) skips them and
// replays only unsettled records. Kafka bounds metadata (offset.metadata.
// max.bytes, 4096 by default); the set is cut to fit, which only means more
// replays, never a loss.

// metaPrefix marks ackwise's metadata; other metadata is ignored.
const metaPrefix = "ackwise1:"

// maxMetaBytes keeps the encoded metadata under Kafka's default limit.
const maxMetaBytes = 3000

// encodeSettled encodes offsets (ascending, all > base) as uvarint deltas.
func encodeSettled(base int64, offs []int64) string {
	if len(offs) == 0 {
		return ""
	}
	buf := make([]byte, 0, len(offs)*2)
	prev := base
	var tmp [binary.MaxVarintLen64]byte
	for _, o := range offs {
		n := binary.PutUvarint(tmp[:], uint64(o-prev))
		if base64.RawURLEncoding.EncodedLen(len(buf)+n)+len(metaPrefix) > maxMetaBytes {
			break
		}
		buf = append(buf, tmp[:n]...)
		prev = o
	}
	return metaPrefix + base64.RawURLEncoding.EncodeToString(buf)
}

// decodeSettled is the inverse of encodeSettled; it returns nil for metadata
// it does not recognize.
func decodeSettled(base int64, meta string) map[int64]struct{} {
	if !strings.HasPrefix(meta, metaPrefix) {
		return nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(meta[len(metaPrefix):])
	if err != nil {
		return nil
	}
	out := make(map[int64]struct{})
	prev := base
	for len(raw) > 0 {
		d, n := binary.Uvarint(raw)
		if n <= 0 || d == 0 {
			return out
		}
		raw = raw[n:]
		prev += int64(d)
		out[prev] = struct{}{}
	}
	return out
}
