package connector

import "testing"

// A status prints as UCM names it; a value that is not one of UCM's codes says so.
func TestStatusString(t *testing.T) {
	for s, want := range map[Status]string{StatusOK: "OK", StatusEParam: "EPARAM", StatusEOSError: "EOSERROR",
		StatusETimeout: "ETIMEOUT", Status(-7): "Status(-7)"} {
		if got := s.String(); got != want {
			t.Errorf("Status(%d).String() = %q, want %q", int32(s), got, want)
		}
	}
}
