"""KVStar: UCM-Go's drop-in for UCM's kvstar_retrieve CPU module (kvstar_retrieve)."""
