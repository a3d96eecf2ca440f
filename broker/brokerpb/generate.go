// Package brokerpb is the generated code of broker.proto, the contract of
// the vram node broker (package vram/broker). Do not edit the .pb.go
// files: change broker.proto and run `go generate ./broker/brokerpb`.
//
// Generating needs protoc from Debian's protobuf-compiler (3.21.12 in
// bookworm: `apt-get install protobuf-compiler`) and the Go plugin, a
// tool dependency in go.mod, so that its version is pinned there and
// `go tool` builds it: google.golang.org/protobuf's protoc-gen-go
// (v1.36.12, the runtime's version). Debian's golang-goprotobuf-dev is
// older (the v1.3 API) and is not used.
package brokerpb

//go:generate sh -c "protoc --plugin=protoc-gen-go=$(go tool -n protoc-gen-go) --go_out=. --go_opt=paths=source_relative broker.proto"
