// One decision from quotad with the stubs protoc generates from
// crates/quotad-proto/proto (build.sh generates them; none are checked in):
// java -cp ... QuotadCheck ADDR POLICY KEY [COST]. Exit 0 allowed, 1 denied,
// 2 refused (quotad names the field first: "cost: must be at least 1"),
// 3 unreachable (the caller's failure policy decides).
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.util.concurrent.TimeUnit;
import quotad.v1.QuotaGrpc;
import quotad.v1.QuotaOuterClass.CheckRequest;
import quotad.v1.QuotaOuterClass.Decision;

public final class QuotadCheck {
  public static void main(String[] args) throws InterruptedException {
    String addr = args.length > 0 ? args[0] : "127.0.0.1:50051";
    String policy = args.length > 1 ? args[1] : "login";
    String key = args.length > 2 ? args[2] : "alice";
    long cost = args.length > 3 ? Long.parseLong(args[3]) : 1;
    ManagedChannel channel = ManagedChannelBuilder.forTarget(addr).usePlaintext().build();
    int exit;
    try {
      Decision d =
          QuotaGrpc.newBlockingStub(channel)
              .withDeadlineAfter(2, TimeUnit.SECONDS)
              .check(CheckRequest.newBuilder().setKey(key).setCost(cost).setPolicyName(policy).build())
              .getDecision();
      System.out.printf(
          "allowed=%b limit=%d remaining=%d retry_after_ms=%d reset_after_ms=%d reason=%s%n",
          d.getAllowed(), d.getLimit(), d.getRemaining(), d.getRetryAfterMs(),
          d.getResetAfterMs(), d.getReason());
      exit = d.getAllowed() ? 0 : 1;
    } catch (StatusRuntimeException e) {
      Status s = e.getStatus();
      System.err.println(s.getCode() + ": " + s.getDescription());
      exit =
          s.getCode() == Status.Code.UNAVAILABLE || s.getCode() == Status.Code.DEADLINE_EXCEEDED
              ? 3
              : 2;
    } finally {
      channel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
    }
    System.exit(exit);
  }
}
