package renew

// RenewAllNow makes every renewable hold of r due and returns when the
// renewer's goroutine has finished that pass.
func RenewAllNow(r *Renewer) { r.renewAllNow() }
