// Package share holds the rules by which one device's memory is divided
// between members: the clients of one vram.Manager, or the leases of the
// processes a node broker (vram/broker) serves.
//
// The rules, once for both:
//   - A member has a manual proportion (0 < p ≤ 1) or is in the auto pool.
//   - Manual proportions never total more than 1.
//   - The auto pool has what the manual members leave, split equally
//     between its members; it is never left under MinAutoPool (5%) while
//     it has members. A manual proportion that would leave it less is
//     refused; with no auto members it is allowed, and a warning says that
//     auto members will be refused until it shrinks.
//   - A member's share in bytes is its proportion of the total, rounded
//     down, so that the shares of all members never add up to more than
//     the total.
//   - Every refusal leaves the pools as they were.
//
// Proportions are kept in fixed point (Unit is 1), so that joining and
// leaving any number of times leaves no rounding drift, and every
// operation is O(1) whatever the number of members.
//
// The package owns the arithmetic and the words of the refusals; it knows
// nothing of clients, leases, devices or locks: a Pools value is protected
// by its owner's mutex.
package share
