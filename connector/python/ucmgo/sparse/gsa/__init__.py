"""GSA: UCM-Go's drop-in for UCM's gsa_offload_ops CPU module (gsa_offload_ops)."""
