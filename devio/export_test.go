package devio

// URingCompiled exposes uringCompiled to the external tests.
const URingCompiled = uringCompiled
