//! The job a command asks for as it resumes the job at its output: the
//! fields an older rsembed recorded otherwise (or not at all) are taken from
//! that job when the two are otherwise one job.

use super::JobSpec;

impl JobSpec {
    /// The same job with footprints to `tolerance` (`None`: the absolute
    /// 5e-8 degrees of older jobs), its id computed again.
    pub fn with_footprint_tolerance(mut self, tolerance: Option<f64>) -> JobSpec {
        self.tiling.footprint_tolerance = tolerance;
        self.job_id = self.id();
        self
    }

    /// The job a command asks for, given the job `theirs` at its output, when
    /// `--footprint-tolerance` was not given: `theirs`'s precision when
    /// `theirs` was written before the flag existed and is otherwise this
    /// job (so resuming it never mixes footprints of two precisions), else
    /// `self` with its default unchanged.
    pub fn resuming_old_footprints(self, theirs: Option<&JobSpec>) -> JobSpec {
        match theirs {
            Some(t) if t.tiling.footprint_tolerance.is_none() => {
                let old = self.clone().with_footprint_tolerance(None);
                if old.is_job_at_schema_of(t) {
                    old
                } else {
                    self
                }
            }
            _ => self,
        }
    }

    /// The same job writing chip schema `version`, its fingerprint and id
    /// computed again.
    pub fn with_schema_version(mut self, version: u32) -> JobSpec {
        self.tiling.schema_version = version;
        self.fingerprint = Self::fingerprint_of(&self.model, &self.tiling);
        self.job_id = self.id();
        self
    }

    /// Whether `self`, at the chip schema version of `theirs`, is `theirs`:
    /// the test of the `resuming_*` steps, each of which takes one field of
    /// the job at the output; [`JobSpec::resuming_schema`] takes the
    /// version last.
    fn is_job_at_schema_of(&self, theirs: &JobSpec) -> bool {
        let v = theirs.tiling.schema_version;
        if self.tiling.schema_version == v {
            return self.job_id == theirs.job_id;
        }
        self.clone().with_schema_version(v).job_id == theirs.job_id
    }

    /// The job a command asks for, given the job `theirs` at its output:
    /// `theirs`'s chip schema version when the two are otherwise one job, so
    /// a job started by an older rsembed resumes writing the schema it
    /// started with and never mixes two under one glob. Call it after the
    /// other `resuming_*` steps. Another job keeps the version of `self`.
    pub fn resuming_schema(self, theirs: Option<&JobSpec>) -> JobSpec {
        match theirs {
            Some(t) if t.tiling.schema_version != self.tiling.schema_version => {
                let old = self.clone().with_schema_version(t.tiling.schema_version);
                if old.job_id == t.job_id {
                    old
                } else {
                    self
                }
            }
            _ => self,
        }
    }

    /// The job a command asks for, given the job `theirs` at its output, when
    /// no grouping flag was given: `theirs`'s grouping when the two are
    /// otherwise one job. A job planned under an older version's defaults
    /// (64 files a task) resumes with them instead of being refused as
    /// another job.
    pub fn resuming_grouping(self, theirs: Option<&JobSpec>) -> JobSpec {
        match theirs.and_then(|t| t.grouping.map(|g| (t, g))) {
            Some((t, g)) if self.grouping != Some(g) => {
                let mut old = self.clone();
                old.grouping = Some(g);
                old.job_id = old.id();
                if old.is_job_at_schema_of(t) {
                    old
                } else {
                    self
                }
            }
            _ => self,
        }
    }

    /// The job a command asks for, given the job `theirs` at its output:
    /// `theirs`'s way of splitting windows (whole, or blocks of cells) when
    /// the two are one job, so a windowed job an older rsembed started keeps
    /// its whole-window tasks and never writes a second row for a (window,
    /// cell). The split is not in the job id: it takes nothing else along.
    pub fn resuming_cell_blocks(mut self, theirs: Option<&JobSpec>) -> JobSpec {
        let Some(t) = theirs.filter(|t| t.job_id == self.job_id) else {
            return self;
        };
        if let (Some(ours), Some(theirs)) = (&mut self.tiling.windows, &t.tiling.windows) {
            ours.cell_blocks = theirs.cell_blocks;
        }
        self
    }
}
