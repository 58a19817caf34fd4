package connector

// BEGIN STATUS CODES (generated from connector/internal/statuscodes; go generate ./connector/)

// UCM's status codes, as the C ABI returns them.
const (
	StatusOK           Status = 0
	StatusError        Status = -1     // a failure no other code names
	StatusEParam       Status = -50000 // bad argument: pointer, count, size, shard index, handle
	StatusEOOM         Status = -50001 // out of memory (staging)
	StatusEOSError     Status = -50002 // the file system failed an operation
	StatusEDuplicate   Status = -50003 // the same block twice in one call, or created twice
	StatusERetry       Status = -50004 // try again (store directory locked by another process)
	StatusENoObj       Status = -50005 // no such block, or no such task
	StatusESerialize   Status = -50006 // not returned by UCM-Go
	StatusEDeserialize Status = -50007 // stored bytes failed a check: the block is a miss now
	StatusEUnsupported Status = -50008 // schema mismatch, or an operation this role does not do
	StatusENoSpace     Status = -50009 // no space on the tier or in staging memory
	StatusETimeout     Status = -50010 // the task outlived timeout_ms and was cancelled
)

// statusNames are the codes' names, as UCM spells them.
var statusNames = map[Status]string{
	StatusOK:           "OK",
	StatusError:        "ERROR",
	StatusEParam:       "EPARAM",
	StatusEOOM:         "EOOM",
	StatusEOSError:     "EOSERROR",
	StatusEDuplicate:   "EDUPLICATE",
	StatusERetry:       "ERETRY",
	StatusENoObj:       "ENOOBJ",
	StatusESerialize:   "ESERIALIZE",
	StatusEDeserialize: "EDESERIALIZE",
	StatusEUnsupported: "EUNSUPPORTED",
	StatusENoSpace:     "ENOSPACE",
	StatusETimeout:     "ETIMEOUT",
}

// END STATUS CODES
