package memory

// murmur2 is Kafka's murmur2 hash (the Java client's Utils.murmur2), so a
// key lands in the same partition number as with Kafka's default
// partitioner.
func murmur2(s string) uint32 {
	const (
		seed uint32 = 0x9747b28c
		m    uint32 = 0x5bd1e995
		r           = 24
	)
	h := seed ^ uint32(len(s))
	for len(s) >= 4 {
		k := uint32(s[3])<<24 | uint32(s[2])<<16 | uint32(s[1])<<8 | uint32(s[0])
		s = s[4:]
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	switch len(s) {
	case 3:
		h ^= uint32(s[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(s[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(s[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}
