package memory

import (
	"strconv"
	"unsafe"
)

// ring is a FIFO queue on a power-of-two circular slice: pushes and pops
// allocate nothing once it has grown to the working size.
type ring[T any] struct {
	buf  []T
	head int
	n    int
}

func (r *ring[T]) len() int { return r.n }

func (r *ring[T]) grow() {
	c := len(r.buf) * 2
	if c < 8 {
		c = 8
	}
	r.resize(c)
}

func (r *ring[T]) resize(c int) {
	nb := make([]T, c)
	for i := 0; i < r.n; i++ {
		nb[i] = r.buf[(r.head+i)&(len(r.buf)-1)]
	}
	r.buf, r.head = nb, 0
}

func (r *ring[T]) push(v T) {
	if r.n == len(r.buf) {
		r.grow()
	}
	r.buf[(r.head+r.n)&(len(r.buf)-1)] = v
	r.n++
}

func (r *ring[T]) front() T { return r.buf[r.head] }

// at returns the i-th element from the front.
func (r *ring[T]) at(i int) T { return r.buf[(r.head+i)&(len(r.buf)-1)] }

func (r *ring[T]) set(i int, v T) { r.buf[(r.head+i)&(len(r.buf)-1)] = v }

func (r *ring[T]) pop() T {
	var zero T
	v := r.buf[r.head]
	r.buf[r.head] = zero
	r.head = (r.head + 1) & (len(r.buf) - 1)
	r.n--
	// Give memory back after a backlog drained (invariant 6 in spirit).
	if len(r.buf) > 1024 && r.n < len(r.buf)/8 {
		r.resize(len(r.buf) / 4)
	}
	return v
}

func (r *ring[T]) clear() {
	var zero T
	for i := 0; i < r.n; i++ {
		r.buf[(r.head+i)&(len(r.buf)-1)] = zero
	}
	r.head, r.n = 0, 0
}

// slab hands out pointers into chunks of T, so that n allocations cost n/slabSize
// heap allocations. A chunk stays alive while any pointer into it does.
type slab[T any] struct {
	chunk []T
}

const slabSize = 128

func (s *slab[T]) alloc() *T {
	if len(s.chunk) == 0 {
		s.chunk = make([]T, slabSize)
	}
	p := &s.chunk[0]
	s.chunk = s.chunk[1:]
	return p
}

// arena copies small byte strings into shared chunks. Bytes handed out are
// never written again, so strings made from them with unsafe.String are
// immutable.
type arena struct {
	buf []byte
}

const (
	arenaChunk = 64 << 10
	arenaMax   = 4 << 10 // larger copies get their own allocation
)

var emptyBytes = []byte{}

func (a *arena) reserve(n int) {
	if cap(a.buf)-len(a.buf) < n {
		a.buf = make([]byte, 0, arenaChunk)
	}
}

// copyBytes returns a copy of p that the caller cannot change. nil stays nil.
func (a *arena) copyBytes(p []byte) []byte {
	if p == nil {
		return nil
	}
	if len(p) == 0 {
		return emptyBytes[:0:0]
	}
	if len(p) > arenaMax {
		c := make([]byte, len(p))
		copy(c, p)
		return c
	}
	a.reserve(len(p))
	off := len(a.buf)
	a.buf = append(a.buf, p...)
	return a.buf[off:len(a.buf):len(a.buf)]
}

// id returns prefix + sep + n (+ sep2 + m when m >= 0) as an immutable string
// carved from the arena.
func (a *arena) id(prefix string, sep byte, n int64, sep2 byte, m int64) string {
	need := len(prefix) + 1 + 20 + 1 + 20
	if need > arenaMax {
		s := prefix + string(sep) + strconv.FormatInt(n, 10)
		if m >= 0 {
			s += string(sep2) + strconv.FormatInt(m, 10)
		}
		return s
	}
	a.reserve(need)
	off := len(a.buf)
	a.buf = append(a.buf, prefix...)
	a.buf = append(a.buf, sep)
	a.buf = strconv.AppendInt(a.buf, n, 10)
	if m >= 0 {
		a.buf = append(a.buf, sep2)
		a.buf = strconv.AppendInt(a.buf, m, 10)
	}
	b := a.buf[off:len(a.buf):len(a.buf)]
	return unsafe.String(&b[0], len(b))
}

// recHeap is a min-heap of records by visibleAt (delays) or leaseUntil
// (leases); each record knows its index, so removal is O(log n).
type recHeap struct {
	items   []*record
	byLease bool
}

func (h *recHeap) len() int { return len(h.items) }

func (h *recHeap) top() *record { return h.items[0] }

func (h *recHeap) key(r *record) int64 {
	if h.byLease {
		return r.leaseUntil.Load()
	}
	return r.visibleAt
}

func (h *recHeap) less(i, j int) bool {
	a, b := h.key(h.items[i]), h.key(h.items[j])
	if a != b {
		return a < b
	}
	return h.items[i].seq < h.items[j].seq
}

func (h *recHeap) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].heapIdx = i
	h.items[j].heapIdx = j
}

func (h *recHeap) up(j int) {
	for {
		i := (j - 1) / 2
		if i == j || !h.less(j, i) {
			break
		}
		h.swap(i, j)
		j = i
	}
}

func (h *recHeap) down(i0 int) bool {
	i := i0
	n := len(h.items)
	for {
		j1 := 2*i + 1
		if j1 >= n || j1 < 0 {
			break
		}
		j := j1
		if j2 := j1 + 1; j2 < n && h.less(j2, j1) {
			j = j2
		}
		if !h.less(j, i) {
			break
		}
		h.swap(i, j)
		i = j
	}
	return i > i0
}

func (h *recHeap) push(r *record) {
	r.heapIdx = len(h.items)
	h.items = append(h.items, r)
	h.up(r.heapIdx)
}

func (h *recHeap) pop() *record {
	n := len(h.items) - 1
	h.swap(0, n)
	r := h.items[n]
	h.items[n] = nil
	h.items = h.items[:n]
	if n > 0 {
		h.down(0)
	}
	r.heapIdx = -1
	return r
}

func (h *recHeap) remove(r *record) {
	i := r.heapIdx
	if i < 0 {
		return
	}
	n := len(h.items) - 1
	if n != i {
		h.swap(i, n)
	}
	h.items[n] = nil
	h.items = h.items[:n]
	if n != i {
		if !h.down(i) {
			h.up(i)
		}
	}
	r.heapIdx = -1
}

func (h *recHeap) fix(r *record) {
	if r.heapIdx < 0 {
		return
	}
	if !h.down(r.heapIdx) {
		h.up(r.heapIdx)
	}
}
