package renew

// RenewAllNow makes every renewable hold of r due and returns when the
// renewer's goroutine has finished that pass.
func RenewAllNow(r *Renewer) { r.renewAllNow() }

// SetStall makes r call f just before it sends each batch of renewals, on
// the goroutine that sends the batch; nil removes the hook. Only r is
// affected.
func SetStall(r *Renewer, f func()) { r.setStall(f) }
