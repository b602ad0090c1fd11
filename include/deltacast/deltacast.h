// The deltacast embedding API: link deltacast::deltacast (CMake find_package) and
// include this header, or the parts: config.h, tensor.h, source.h (the trainer's
// end), producer.h (the trainer's end as many producers and a root), node.h (a
// receiver), status.h, log.h.
#pragma once

#include "deltacast/config.h"
#include "deltacast/log.h"
#include "deltacast/node.h"
#include "deltacast/producer.h"
#include "deltacast/source.h"
#include "deltacast/status.h"
#include "deltacast/tensor.h"
