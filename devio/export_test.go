package devio

// URingCompiled exposes uringCompiled to the external tests.
const URingCompiled = uringCompiled

// IdleHostBytes is the pool's idle host-buffer bytes.
func (p *BufferPool) IdleHostBytes() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.idleBytes
}
