//! JUnit XML: one suite per clause family, one test case per case.
//! An unwaived fail and error map to JUnit failure and error; unsupported,
//! inconclusive and waived cases are skipped (never passed); non-strict
//! passes with a note. The run's result and the failing classes are
//! properties of every suite.

use std::time::Duration;

use idem_spec::report::{Report, Verdict};
use quick_junit::{NonSuccessKind, TestCase, TestCaseStatus, TestSuite};

/// Renders the JUnit XML report.
pub fn render(r: &Report) -> Result<String, crate::Error> {
    let mut report = quick_junit::Report::new("idem-conformance");
    report.set_time(Duration::from_millis(r.duration_ms));
    let mut families: Vec<&str> = r.cases.iter().map(|c| c.family.as_str()).collect();
    families.dedup();
    for fam in families {
        let mut suite = TestSuite::new(fam);
        suite.add_property(("target", r.target.as_str()));
        suite.add_property(("profile", r.profile.as_str()));
        suite.add_property(("contract_version", r.contract_version.as_str()));
        suite.add_property(("kit_version", r.kit_version.as_str()));
        suite.add_property(("manifest_sha256", r.manifest_sha256.as_str()));
        suite.add_property(("seed", r.seed.to_string().as_str()));
        suite.add_property(("result", r.summary.result.as_str()));
        suite.add_property(("exit_code", r.summary.exit_code.to_string().as_str()));
        for c in r.cases.iter().filter(|c| c.family == fam) {
            let explanation = super::explain(c).join("\n");
            let mut status = match (c.verdict, &c.waived) {
                (Verdict::Pass | Verdict::NonStrict, _) => TestCaseStatus::success(),
                (Verdict::Fail, None) => TestCaseStatus::non_success(NonSuccessKind::Failure),
                (Verdict::Error, None) => TestCaseStatus::non_success(NonSuccessKind::Error),
                _ => TestCaseStatus::skipped(),
            };
            if c.verdict != Verdict::Pass {
                let class = super::failed_class(c)
                    .filter(|_| c.verdict == Verdict::Fail)
                    .map_or(String::new(), |k| format!(" ({k})"));
                status.set_message(format!(
                    "{}{class}{}",
                    c.verdict,
                    c.reason
                        .as_ref()
                        .map_or(String::new(), |r| format!(": {r}"))
                ));
                status.set_description(explanation.clone());
            }
            let mut tc = TestCase::new(c.id.as_str(), status);
            tc.set_classname(format!("idem-conformance.{fam}"));
            tc.set_time(Duration::from_millis(c.duration_ms));
            tc.add_property(("clauses", c.clauses.join(",").as_str()));
            tc.add_property(("verdict", c.verdict.as_str()));
            if let Some(k) = super::failed_class(c).filter(|_| c.verdict == Verdict::Fail) {
                tc.add_property(("class", k.as_str()));
            }
            if c.verdict == Verdict::NonStrict {
                tc.set_system_out(explanation);
            }
            suite.add_test_case(tc);
        }
        report.add_test_suite(suite);
    }
    if let Some(why) = &r.harness_error {
        // A run that stopped before its cases: one errored test, so a CI
        // job that publishes the report shows why.
        let mut suite = TestSuite::new("preflight");
        suite.add_property(("result", r.summary.result.as_str()));
        suite.add_property(("exit_code", r.summary.exit_code.to_string().as_str()));
        let mut status = TestCaseStatus::non_success(NonSuccessKind::Error);
        status.set_message(why.clone());
        let mut tc = TestCase::new("preflight", status);
        tc.set_classname("idem-conformance.preflight");
        suite.add_test_case(tc);
        report.add_test_suite(suite);
    }
    report
        .to_string()
        .map_err(|e| crate::Error::Report(e.to_string()))
}
