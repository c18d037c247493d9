// The device mesh: the world's ranks laid out as pp × dp × cp × tp, and one rank's groups along
// each axis. Mesh order is tp fastest, then cp, then dp, then pp (DESIGN.md invariant 3, with
// context parallelism between tp and dp as in Megatron-LM), so a tensor-parallel group is a run
// of consecutive world ranks (one node) and a pipeline group strides across them:
//
//   rank = ((pp · dp_size + dp) · cp_size + cp) · tp_size + tp
//
// e.g. pp2·dp2·tp2: tp groups {0,1} {2,3} {4,5} {6,7}; dp groups {0,2} {1,3} {4,6} {5,7};
// pp groups {0,4} {1,5} {2,6} {3,7}. Every group is ranked by its own coordinate, so
// tp().rank() == coordinates().tp, and so on.
#pragma once

#include <optional>
#include <string>

#include "comm/communicator.h"

namespace lattice {

struct MeshShape {
  int pp = 1;
  int dp = 1;
  int tp = 1;
  int cp = 1;  // context parallelism (parallel/context_parallel.h)
  // Expert parallelism: groups of ep consecutive dp ranks share a layer's experts (not an axis
  // of the world: ep divides dp).
  int ep = 1;

  int world_size() const { return pp * dp * cp * tp; }
  std::string to_string() const;  // "pp1·dp2·tp2"; "pp1·dp1·cp2·tp2" with cp
  bool operator==(const MeshShape&) const = default;
};

struct MeshCoordinates {
  int pp = 0;
  int dp = 0;
  int tp = 0;
  int cp = 0;

  std::string to_string() const;  // "pp0·dp1·tp0"; with cp > 0 "pp0·dp1·cp1·tp0"
  bool operator==(const MeshCoordinates&) const = default;
};

// Throws ConfigError naming the numbers and the fix when an axis is < 1 or pp·dp·tp differs
// from `world_size`. Call it before allocating anything for the layout.
void validate_mesh(const MeshShape& shape, int world_size);

// Coordinates of `world_rank` and back; ValueError for a rank or coordinate outside the mesh.
MeshCoordinates mesh_coordinates(const MeshShape& shape, int world_rank);
int mesh_rank(const MeshShape& shape, const MeshCoordinates& coordinates);

// One rank's view of the mesh. Constructing it is collective over `world`: every rank calls it
// with the same shape, and it makes the tp, dp, pp and embedding groups in that order (then,
// with cp > 1, the cp and replica groups)
// (Communicator::split is deterministic, so every rank derives the same groups). `world` must
// outlive the mesh. Groups are named for what they are, e.g. "tp[pp0·dp1]" holds the tp ranks
// at pp 0, dp 1; timeout errors quote these names.
class DeviceMesh {
 public:
  DeviceMesh(Communicator& world, MeshShape shape);

  const MeshShape& shape() const { return shape_; }
  const MeshCoordinates& coordinates() const { return coordinates_; }

  Communicator& world() { return *world_; }
  Communicator& tp() { return tp_; }
  Communicator& dp() { return dp_; }
  Communicator& pp() { return pp_; }
  // The context-parallel group of this rank's (pp, dp, tp); nullptr when cp == 1.
  Communicator* cp() { return cp_ ? &*cp_ : nullptr; }
  // The ranks holding the same parameters as this one: its (pp, tp) over dp × cp, ranked
  // dp · cp_size + cp. Gradients are summed and ZeRO shards laid out over it (context
  // parallelism folded into data parallelism, as Megatron-LM does); the dp group when cp == 1.
  Communicator& replicas() { return replicas_ ? *replicas_ : dp_; }
  // The first and last pipeline stage of this rank's (dp, tp), first stage at group rank 0:
  // tied embeddings reduce their gradients over it. nullptr on the middle stages; a group of one
  // when pp == 1.
  Communicator* embedding() { return embedding_ ? &*embedding_ : nullptr; }
  // Expert parallelism (ep > 1): the ep consecutive dp ranks whose experts together make a
  // layer's (group rank = dp coordinate mod ep), and the dp ranks holding the same experts as
  // this one (dp coordinate / ep), over which their gradients are summed. nullptr / the dp group
  // when ep == 1.
  Communicator* ep() { return ep_ ? &*ep_ : nullptr; }
  Communicator& expert_replicas() { return expert_replicas_ ? *expert_replicas_ : replicas(); }

  bool is_first_stage() const { return coordinates_.pp == 0; }
  bool is_last_stage() const { return coordinates_.pp == shape_.pp - 1; }

 private:
  Communicator* world_;
  MeshShape shape_;
  MeshCoordinates coordinates_;
  Communicator tp_;
  Communicator dp_;
  Communicator pp_;
  std::optional<Communicator> embedding_;
  std::optional<Communicator> cp_;
  std::optional<Communicator> replicas_;
  std::optional<Communicator> ep_, expert_replicas_;
};

}  // namespace lattice
