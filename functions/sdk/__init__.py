"""The guest SDKs, shipped in the wheel as `edgefn_sdk`: c/edgefn.h for C and
assemblyscript/edgefn.ts for AssemblyScript. The Python SDK is the `edgefn`
package (functions/sdk/python/edgefn/), which functions import inside isolates.
"""

from pathlib import Path

DIR = Path(__file__).resolve().parent
C_HEADER = DIR / "c" / "edgefn.h"
ASSEMBLYSCRIPT = DIR / "assemblyscript" / "edgefn.ts"
