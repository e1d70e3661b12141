// The fabric of processes started by mpirun (Open MPI), over MPI_COMM_WORLD. Only nonblocking
// calls are made (Isend, Iprobe, Irecv, Test), in loops that watch the deadline and sleep
// between polls, so an idle rank leaves the cores to the ranks computing.
//
// MPI over TCP has no authentication or encryption and its TCP transport listens on every
// interface; open() therefore needs the interface (or CIDR) the job's data may use, which it
// hands to Open MPI as btl_tcp_if_include before MPI_Init (README: use a dedicated link).
#pragma once
#include <memory>
#include <string>

#include "fabric/fabric.h"

namespace sluice::fabric {

// True when this binary was built with MPI (libopenmpi-dev present).
bool mpi_available();
// True when this process was started by mpirun (its environment says so).
bool launched_by_mpirun();
// Initializes MPI (once per process) and returns the fabric of MPI_COMM_WORLD. Throws Error
// without MPI, without mpirun, or with an empty interface. MPI is finalized when it is destroyed.
std::unique_ptr<Fabric> open_mpi_fabric(const std::string& interface);

}  // namespace sluice::fabric
