#include "parallel/device_mesh.h"

#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace lattice {
namespace {

void validate_axes(const MeshShape& shape) {
  const std::pair<const char*, int> axes[] = {
      {"pp", shape.pp}, {"dp", shape.dp}, {"cp", shape.cp}, {"tp", shape.tp}};
  if (shape.ep < 1 || shape.dp % shape.ep != 0) {
    LATTICE_THROW(ConfigError,
                  "mesh {}: --ep {} must divide --dp {} (experts spread over consecutive dp "
                  "ranks) ---> HINT: choose an --ep that divides --dp",
                  shape.to_string(), shape.ep, shape.dp);
  }
  for (const auto& [axis, size] : axes) {
    if (size < 1) {
      LATTICE_THROW(ConfigError,
                    "mesh {}: {} is {}, but every axis needs at least one rank ---> HINT: set "
                    "--{} to a positive count (1 turns that parallelism off)",
                    shape.to_string(), axis, size, axis);
    }
  }
}

const MeshShape& validated(const MeshShape& shape, int world_size) {
  validate_mesh(shape, world_size);
  return shape;
}

// A split of `world` into groups along one axis: `color` numbers the group (the other two
// coordinates), `key` orders ranks within it (the axis' own coordinate).
Communicator split_axis(Communicator& world, int color, int key, std::string name) {
  Communicator group = world.split(color, key);
  group.set_name(std::move(name));
  return group;
}

std::optional<Communicator> make_embedding_group(Communicator& pp, const MeshShape& shape,
                                                 const MeshCoordinates& at) {
  std::vector<int> stages{0};
  if (shape.pp > 1) stages.push_back(shape.pp - 1);
  std::optional<Communicator> group = pp.new_group(stages);
  if (group) group->set_name(fmt::format("embedding[dp{}·tp{}]", at.dp, at.tp));
  return group;
}

// "·cp1" in the names of a mesh with context parallelism; nothing without.
std::string cp_suffix(const MeshShape& shape, const MeshCoordinates& at) {
  return shape.cp > 1 ? fmt::format("·cp{}", at.cp) : std::string();
}

std::optional<Communicator> make_cp_group(Communicator& world, const MeshShape& shape,
                                          const MeshCoordinates& at) {
  if (shape.cp == 1) return std::nullopt;
  return split_axis(world, (at.pp * shape.dp + at.dp) * shape.tp + at.tp, at.cp,
                    fmt::format("cp[pp{}·dp{}·tp{}]", at.pp, at.dp, at.tp));
}

std::optional<Communicator> make_replica_group(Communicator& world, const MeshShape& shape,
                                               const MeshCoordinates& at) {
  if (shape.cp == 1) return std::nullopt;
  return split_axis(world, at.pp * shape.tp + at.tp, at.dp * shape.cp + at.cp,
                    fmt::format("dp·cp[pp{}·tp{}]", at.pp, at.tp));
}

}  // namespace

std::string MeshShape::to_string() const {
  return cp > 1 ? fmt::format("pp{}·dp{}·cp{}·tp{}", pp, dp, cp, tp)
                : fmt::format("pp{}·dp{}·tp{}", pp, dp, tp);
}

std::string MeshCoordinates::to_string() const {
  return cp > 0 ? fmt::format("pp{}·dp{}·cp{}·tp{}", pp, dp, cp, tp)
                : fmt::format("pp{}·dp{}·tp{}", pp, dp, tp);
}

void validate_mesh(const MeshShape& shape, int world_size) {
  validate_axes(shape);
  const int64_t product = int64_t(shape.pp) * shape.dp * shape.cp * shape.tp;
  if (product != world_size) {
    if (shape.cp > 1) {
      LATTICE_THROW(ConfigError,
                    "mesh {} needs pp·dp·cp·tp = {}·{}·{}·{} = {} ranks, but the world has {} "
                    "---> HINT: run {} ranks (e.g. `mpirun -np {}`), or choose --pp, --dp, --cp "
                    "and --tp whose product is {}",
                    shape.to_string(), shape.pp, shape.dp, shape.cp, shape.tp, product, world_size,
                    product, product, world_size);
    }
    LATTICE_THROW(ConfigError,
                  "mesh {} needs pp·dp·tp = {}·{}·{} = {} ranks, but the world has {} ---> HINT: "
                  "run {} ranks (e.g. `mpirun -np {}`), or choose --pp, --dp and --tp whose "
                  "product is {}",
                  shape.to_string(), shape.pp, shape.dp, shape.tp, product, world_size, product,
                  product, world_size);
  }
}

MeshCoordinates mesh_coordinates(const MeshShape& shape, int world_rank) {
  validate_axes(shape);
  if (world_rank < 0 || world_rank >= shape.world_size()) {
    LATTICE_THROW(ValueError, "world rank {} is outside mesh {}, whose ranks are 0..{}", world_rank,
                  shape.to_string(), shape.world_size() - 1);
  }
  MeshCoordinates at;
  at.tp = world_rank % shape.tp;
  at.cp = world_rank / shape.tp % shape.cp;
  at.dp = world_rank / (shape.tp * shape.cp) % shape.dp;
  at.pp = world_rank / (shape.tp * shape.cp * shape.dp);
  return at;
}

int mesh_rank(const MeshShape& shape, const MeshCoordinates& at) {
  validate_axes(shape);
  if (at.pp < 0 || at.pp >= shape.pp || at.dp < 0 || at.dp >= shape.dp || at.cp < 0 ||
      at.cp >= shape.cp || at.tp < 0 || at.tp >= shape.tp) {
    LATTICE_THROW(ValueError, "coordinates {} are outside mesh {}", at.to_string(),
                  shape.to_string());
  }
  return ((at.pp * shape.dp + at.dp) * shape.cp + at.cp) * shape.tp + at.tp;
}

DeviceMesh::DeviceMesh(Communicator& world, MeshShape shape)
    : world_(&world),
      shape_(validated(shape, world.size())),
      coordinates_(mesh_coordinates(shape_, world.rank())),
      tp_(split_axis(world,
                     (coordinates_.pp * shape_.dp + coordinates_.dp) * shape_.cp + coordinates_.cp,
                     coordinates_.tp,
                     fmt::format("tp[pp{}·dp{}{}]", coordinates_.pp, coordinates_.dp,
                                 cp_suffix(shape_, coordinates_)))),
      dp_(split_axis(world,
                     (coordinates_.pp * shape_.cp + coordinates_.cp) * shape_.tp + coordinates_.tp,
                     coordinates_.dp,
                     fmt::format("dp[pp{}·tp{}{}]", coordinates_.pp, coordinates_.tp,
                                 cp_suffix(shape_, coordinates_)))),
      pp_(split_axis(world,
                     (coordinates_.dp * shape_.cp + coordinates_.cp) * shape_.tp + coordinates_.tp,
                     coordinates_.pp,
                     fmt::format("pp[dp{}·tp{}{}]", coordinates_.dp, coordinates_.tp,
                                 cp_suffix(shape_, coordinates_)))),
      embedding_(make_embedding_group(pp_, shape_, coordinates_)),
      cp_(make_cp_group(world, shape_, coordinates_)),
      replicas_(make_replica_group(world, shape_, coordinates_)) {
  if (shape_.ep <= 1) return;
  const MeshCoordinates& at = coordinates_;
  ep_ = split_axis(dp_, at.dp / shape_.ep, at.dp % shape_.ep,
                   fmt::format("ep[pp{}·tp{}·dp{}-{}]", at.pp, at.tp, at.dp / shape_.ep * shape_.ep,
                               at.dp / shape_.ep * shape_.ep + shape_.ep - 1));
  expert_replicas_ =
      split_axis(dp_, at.dp % shape_.ep, at.dp / shape_.ep,
                 fmt::format("edp[pp{}·tp{}·ep{}]", at.pp, at.tp, at.dp % shape_.ep));
}

}  // namespace lattice
