"""Slurm batch jobs for hpcdl: templates for national-lab GPU systems, rendering, submission and status.

    from hpcdl.slurm import JobRequest, render_job, submit_script, wait_for_job
    script = render_job(JobRequest(system="perlmutter", config="climate-deeplab", nodes=8,
                                   time="02:00:00", account="m1234"))
    job_id = submit_script(script)
"""

from hpcdl.slurm.errors import SlurmError
from hpcdl.slurm.render import JobRequest, render_job, render_script
from hpcdl.slurm.submit import JobInfo, format_jobs, job_status, submit_script, wait_for_job
from hpcdl.slurm.systems import SYSTEMS, SlurmSystem, get_system

__all__ = ["JobInfo", "JobRequest", "SYSTEMS", "SlurmError", "SlurmSystem", "format_jobs", "get_system", "job_status",
           "render_job", "render_script", "submit_script", "wait_for_job"]
