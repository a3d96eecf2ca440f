// Package workspace runs the tests of the repository's other modules —
// the command line (cmd/vram) and the deployment's tests
// (deploy/kubernetes), which go.work names beside the library — from the
// root module's `go test ./...`, whose pattern stops at the root module's
// edge. They are modules of their own so that a library user's go.mod
// gains nothing that only the command or those tests need (cobra, plot,
// the Kubernetes API). The package holds no code: its test does the work.
package workspace
