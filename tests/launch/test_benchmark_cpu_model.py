"""Every benchmark report names the CPU its figures come from (`launch.benchmark_suites.common.cpu_model`)."""

import os
import platform

from launch.benchmark_suites import common

INTEL = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 167
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu vme avx2 avx512f avx512_bf16 amx_tile

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: a second block that must not be read
"""
AMD = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 23
model\t\t: 49
model name\t: AMD EPYC 7B12
flags\t\t: fpu vme avx2 fma
"""


def test_the_cpu_model_names_vendor_family_model_and_avx512_from_the_first_processor(tmp_path):
    intel, amd = tmp_path / "intel", tmp_path / "amd"
    intel.write_text(INTEL)
    amd.write_text(AMD)
    assert common.cpu_model(str(intel)) == "Intel(R) Xeon(R) Processor (GenuineIntel family 6 model 167, avx512f)"
    assert common.cpu_model(str(amd)) == "AMD EPYC 7B12 (AuthenticAMD family 23 model 49)"


def test_without_proc_cpuinfo_the_model_falls_back_to_the_platform(tmp_path):
    assert common.cpu_model(str(tmp_path / "missing")) == (platform.processor() or platform.machine())


def test_the_report_prints_the_cpu_model_and_puts_it_in_the_json_line(capsys):
    common.emit(common.Report(suite="forward", columns=["engine"], rows=[["flax"]], figures={"flax_over_torch": 1.0}))
    out = capsys.readouterr().out.splitlines()
    assert out[1] == f"CPU: {common.cpu_model()}, {os.cpu_count()} cores"
    assert f'"cpu_model": "{common.cpu_model()}"' in out[-1]
