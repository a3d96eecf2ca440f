package streams

// SetHoldHook sets a function that Hold calls once it holds its group,
// before it returns; nil removes it.
func SetHoldHook(f func()) { testHookHeld = f }
