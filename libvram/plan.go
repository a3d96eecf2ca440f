package main

// vram_plan: the planner (vram.Plan) alone, on requests described in
// JSON, for callers that ask what a batch would be cut into without a
// manager or an allocation (the cubie drop-in's get_chunk_parameters). A
// plan that does not fit is an answer, not a failure: the JSON says which
// error (ErrUnchunkable, ErrRunTooLarge, ErrRunsMismatch, ErrInvalidRequest)
// with its figures, so that the caller can word it.

/*
#include <stdint.h>
*/
import "C"

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/vramkit/vram"
)

// planRequest is one array request as vram_plan reads it.
type planRequest struct {
	Shape       []int  `json:"shape"`
	DType       string `json:"dtype"`
	Memory      string `json:"memory"` // "" is device
	ChunkAxis   int    `json:"chunk_axis"`
	Unchunkable bool   `json:"unchunkable"`
	TotalRuns   int    `json:"total_runs"`
}

// planInput is vram_plan's argument.
type planInput struct {
	Requests       map[string]map[string]planRequest `json:"requests"` // owner → label → request
	Budget         uint64                            `json:"budget"`   // bytes
	Granularity    uint64                            `json:"granularity"`
	Buffers        int                               `json:"buffers"`
	MaxChunkLength int                               `json:"max_chunk_length"`
}

// planError is a refusal as vram_plan reports it.
type planError struct {
	Kind    string       `json:"kind"` // unchunkable, run_too_large, runs_mismatch, invalid_request
	Message string       `json:"message"`
	Figures *planFigures `json:"figures,omitempty"` // a plan that does not fit: vram.PlanError's figures
}

// planFigures are a vram.PlanError's figures, in bytes.
type planFigures struct {
	Need             uint64 `json:"need"`
	Budget           uint64 `json:"budget"`
	UnchunkableBytes uint64 `json:"unchunkable_bytes"`
	RunBytes         uint64 `json:"run_bytes"`
	Buffers          int    `json:"buffers"`
	Chunkable        int    `json:"chunkable"` // chunkable device requests
	Hint             string `json:"hint"`
}

// planOutput is vram_plan's answer: a plan, or why there is none.
type planOutput struct {
	Plan  *vram.ChunkPlan `json:"plan,omitempty"`
	Error *planError      `json:"error,omitempty"`
}

func (r planRequest) request() (vram.ArrayRequest, error) {
	dt, err := vram.ParseDType(r.DType)
	if err != nil {
		return vram.ArrayRequest{}, err
	}
	mem := vram.Device
	if r.Memory != "" {
		if mem, err = vram.ParseMemoryType(r.Memory); err != nil {
			return vram.ArrayRequest{}, err
		}
	}
	return vram.ArrayRequest{Shape: r.Shape, DType: dt, Memory: mem, ChunkAxis: r.ChunkAxis,
		Unchunkable: r.Unchunkable, TotalRuns: r.TotalRuns}, nil
}

// plan answers in: the plan, or a planError; an error only for input that
// is not a plan's question (bad JSON, a bad dtype or memory name).
func plan(in []byte) (planOutput, error) {
	var p planInput
	if err := json.Unmarshal(in, &p); err != nil {
		return planOutput{}, fmt.Errorf("vram: plan: the request is not planInput JSON: %w: %w", err, vram.ErrInvalidRequest)
	}
	reqs := make(map[string]map[string]vram.ArrayRequest, len(p.Requests))
	for owner, labels := range p.Requests {
		reqs[owner] = make(map[string]vram.ArrayRequest, len(labels))
		for label, r := range labels {
			req, err := r.request()
			if err != nil {
				return planOutput{}, fmt.Errorf("vram: plan: %s of %s: %w", label, owner, err)
			}
			reqs[owner][label] = req
		}
	}
	cp, err := vram.Plan(reqs, p.Budget, vram.PlanOptions{Granularity: p.Granularity, Buffers: p.Buffers, MaxChunkLength: p.MaxChunkLength})
	if err == nil {
		return planOutput{Plan: &cp}, nil
	}
	pe := &planError{Message: err.Error()}
	if e := (*vram.PlanError)(nil); errors.As(err, &e) {
		pe.Figures = &planFigures{Need: e.Need, Budget: e.Budget, UnchunkableBytes: e.UnchunkableBytes,
			RunBytes: e.RunBytes, Buffers: e.Buffers, Chunkable: e.Chunkable, Hint: e.Hint}
	}
	switch {
	case errors.Is(err, vram.ErrUnchunkable):
		pe.Kind = "unchunkable"
	case errors.Is(err, vram.ErrRunTooLarge):
		pe.Kind = "run_too_large"
	case errors.Is(err, vram.ErrRunsMismatch):
		pe.Kind = "runs_mismatch"
	default:
		pe.Kind = "invalid_request"
	}
	return planOutput{Error: pe}, nil
}

//export vramgo_plan
func vramgo_plan(in *C.char, out **C.char, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	o, err := plan([]byte(C.GoString(in)))
	if err != nil {
		return fail(errOut, err)
	}
	b, err := json.Marshal(o)
	if err != nil {
		return fail(errOut, fmt.Errorf("vram: plan as JSON: %w", err))
	}
	return text(out, string(b))
}
