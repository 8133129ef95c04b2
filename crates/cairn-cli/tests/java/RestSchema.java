// Reads cairn's REST answers with Flink's own response classes and JSON mapper, the way
// Flink's REST client does: every constructor property required, unknown fields ignored.
//
// java -cp 'PYFLINK/lib/*' RestSchema.java http://HOST:PORT JOBID
//
// Prints one line per endpoint with what Flink's classes read from it; exits with 1 and the
// parse error at the first answer they cannot read.

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;

import org.apache.flink.runtime.messages.webmonitor.JobDetails;
import org.apache.flink.runtime.messages.webmonitor.JobIdsWithStatusOverview;
import org.apache.flink.runtime.messages.webmonitor.MultipleJobsDetails;
import org.apache.flink.runtime.rest.handler.legacy.messages.ClusterOverviewWithVersion;
import org.apache.flink.runtime.rest.messages.DashboardConfiguration;
import org.apache.flink.runtime.rest.messages.checkpoints.CheckpointingStatistics;
import org.apache.flink.runtime.rest.messages.job.JobDetailsInfo;
import org.apache.flink.runtime.rest.util.RestMapperUtils;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.ObjectMapper;

public class RestSchema {
    private static final HttpClient HTTP =
            HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();
    private static final ObjectMapper MAPPER = RestMapperUtils.getFlexibleObjectMapper();

    private static <T> T read(String base, String path, Class<T> type) throws Exception {
        HttpRequest request =
                HttpRequest.newBuilder(URI.create(base + path))
                        .timeout(Duration.ofSeconds(10))
                        .GET()
                        .build();
        HttpResponse<String> response = HTTP.send(request, HttpResponse.BodyHandlers.ofString());
        if (response.statusCode() != 200) {
            throw new IllegalStateException(
                    "GET " + path + " answered " + response.statusCode() + ": " + response.body());
        }
        try {
            return MAPPER.readValue(response.body(), type);
        } catch (Exception e) {
            throw new IllegalStateException(
                    "GET " + path + ": Flink's " + type.getSimpleName() + " cannot read "
                            + response.body() + ": " + e.getMessage(),
                    e);
        }
    }

    public static void main(String[] args) throws Exception {
        String base = args[0];
        String jid = args[1];
        try {
            JobIdsWithStatusOverview ids = read(base, "/v1/jobs", JobIdsWithStatusOverview.class);
            for (JobIdsWithStatusOverview.JobIdWithStatus job : ids.getJobsWithStatus()) {
                System.out.println("jobs " + job.getJobId() + " " + job.getJobStatus());
            }
            MultipleJobsDetails overview =
                    read(base, "/v1/jobs/overview", MultipleJobsDetails.class);
            for (JobDetails job : overview.getJobs()) {
                System.out.println(
                        "overview " + job.getJobId() + " " + job.getJobName() + " "
                                + job.getStatus() + " tasks=" + job.getNumTasks());
            }
            JobDetailsInfo details = read(base, "/v1/jobs/" + jid, JobDetailsInfo.class);
            System.out.println(
                    "details " + details.getJobId() + " " + details.getName() + " "
                            + details.getJobStatus() + " vertices="
                            + details.getJobVertexInfos().size());
            CheckpointingStatistics checkpoints =
                    read(base, "/v1/jobs/" + jid + "/checkpoints", CheckpointingStatistics.class);
            System.out.println(
                    "checkpoints completed=" + checkpoints.getCounts().getNumberCompletedCheckpoints()
                            + " history=" + checkpoints.getHistory().size()
                            + " latest=" + (checkpoints.getLatestCheckpoints().getCompletedCheckpointStatistics() == null
                                    ? "none"
                                    : checkpoints.getLatestCheckpoints().getCompletedCheckpointStatistics().getId()));
            DashboardConfiguration config = read(base, "/v1/config", DashboardConfiguration.class);
            System.out.println("config flink-version=" + config.getFlinkVersion());
            ClusterOverviewWithVersion cluster =
                    read(base, "/v1/overview", ClusterOverviewWithVersion.class);
            System.out.println(
                    "cluster taskmanagers=" + cluster.getNumTaskManagersConnected()
                            + " slots=" + cluster.getNumSlotsTotal()
                            + " running=" + cluster.getNumJobsRunningOrPending());
        } catch (Exception e) {
            System.err.println(e.getMessage());
            System.exit(1);
        }
    }
}
